"""Train an EAGLE-3 draft head on teacher data (``train.data``) with the TTT objective (``train.ttt``).

AdamW (``nn.AdamWeightDecay``) with linear warm-up then cosine decay, global-norm gradient clipping, a
compiled train step (``ms.value_and_grad`` under ``ms.jit``), checkpoints every ``--ckpt-every`` steps and at
the end (``last.safetensors`` = head + optimizer state, ``best.safetensors`` = the head with the best held-out simulated tau,
both written atomically), resume from ``last.safetensors``, a progress line, and held-out ``acc_k`` per TTT step plus
the simulated tau ``1 + sum_k prod_{i<=k} acc_i``. SIGTERM (a background job's session ending, ``kill``) stops the run
after the batch in flight: it saves ``last.safetensors`` and exports the best head as the end of the time budget does
(without the final evaluation), so a resume loses no step and the export is there without ``--export-only``.

Static shapes: sequences are grouped by length into a few entry buckets (``T`` in ``--buckets``) with about
``--tokens-per-batch`` entries per batch, so each bucket compiles one graph. The held-out split is a fixed
fraction of prompt ids (by hash), so it never changes between runs or on resume.

Directories: ``--out`` is replaced by the export, so it must be missing, empty or a head (a rerun's own export)
unless ``--overwrite``. The run directory records its identity when created (``train.identity``: the teacher's
fingerprint, the data's digest, the vocabulary, TTT steps, head width, buckets, schedule, ...) and a resume with
another one is refused naming the keys; budgets (``--max-steps``, ``--epochs``, ``--time-limit-min``) and run control
(evaluation and checkpoint intervals, ``--patience``) may change on resume. The data must be this teacher's
(``train.data`` records its teacher); the default data directory is keyed by the teacher's fingerprint.

Early checks: every flag is range-checked before anything is read, loaded or written (``check_train_flags``:
``--eval-every 0``, ``--clip -1`` or ``--lr nan`` name the flag, the value and what is allowed), then against the
teacher's config before the data is generated (``check_train_fits``: positions past its rotary table, a head and
optimizer larger than this machine's memory); token ids outside the teacher's vocabulary in the data are a
``DataError`` naming the sequence and the id, before the teacher loads.

Entry point: ``train_draft_main(argv)`` (the ``mindspore-eagle train-draft`` command).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import numpy as np

from ..storage.atomic import check_output_dir
from ..storage.checkpoint import load_tensors, save_tensors, tensor_shapes
from ..runtime import smallest_holding
from ..errors import CheckpointError, ConfigError, DataError, IdentityError
from ..storage.fingerprint import directory_fingerprint
from .data import (MANIFEST, Sequence_, StoredSequence, check_shapes, check_token_ids, conversation_id,
                   first_out_of_vocab, index_sequences, manifest_good_bytes, on_sigterm)
from .clock import TrainClock, counting_pauses
from .identity import check_claimable, claim, mismatch, read_identity
from .sharegpt import source_of
from .train_config import TrainConfig, build_parser
from .ttt import TTTLoss, pack_batch, simulated_tau
from .vocab import DraftVocab, build_draft_vocab, count_tokens, coverage

VOCAB_FILE = "draft_vocab.npz"
STATE_FILE = "state.json"
LAST_FILE = "last.safetensors"  # head + optimizer state, for resuming
BEST_FILE = "best.safetensors"  # the head with the best held-out simulated tau, for export
# What the trainer writes into a run directory: all ``--overwrite`` removes from one that belongs to another run.
RUN_FILES = (VOCAB_FILE,) + tuple(n + tmp for n in (STATE_FILE, LAST_FILE, BEST_FILE) for tmp in ("", ".tmp"))
RUN_REMEDY = ("pass --overwrite to start it afresh (only the trainer's own files in it are removed) or choose another "
              "--run-dir")
EXPORT_KEYS = ("teacher", "head_intermediate")  # what an --export-only shares with its run: what shapes the head


def heldout(pid: str, fraction: float) -> bool:
    """Whether a sequence is held out: by its conversation (``data.conversation_id``), so both turns of a
    conversation fall on the same side of the split."""
    return int(hashlib.sha1(conversation_id(pid).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


def make_batches(seqs: list[StoredSequence] | list[Sequence_], buckets: tuple[int, ...], tokens_per_batch: int, rng: np.random.Generator,
                 shuffle: bool = True) -> list[tuple[int, list[Sequence_]]]:
    """``(T, sequences)`` batches: each sequence goes to the smallest bucket holding its entries (longer ones are
    truncated to the largest), ``tokens_per_batch // T`` sequences per batch (last partial batch padded later)."""
    by_bucket: dict[int, list[Sequence_]] = {b: [] for b in buckets}
    for s in seqs:
        n = len(s.tokens) - 1
        by_bucket[smallest_holding(buckets, n, buckets[-1])].append(s)
    out = []
    for t, group in by_bucket.items():
        if shuffle:
            group = [group[i] for i in rng.permutation(len(group))]
        per = max(1, tokens_per_batch // t)
        out += [(t, group[i:i + per]) for i in range(0, len(group), per)]
    if shuffle:
        out = [out[i] for i in rng.permutation(len(out))]
    return out


def init_head(cfg, teacher_cell, vocab: DraftVocab, seed: int):
    """A fresh head: ``fc`` and midlayer projections ~ N(0, 0.02), norms 1, ``norm`` = the teacher's final norm
    and ``lm_head`` = the teacher's output embedding rows of the draft vocabulary (the head's output space
    starts as the teacher's). Not a "logit lens" identity on the high tap: entry i's features belong to
    position i while its target is the token at i + 2, so passing them through would predict the input token."""
    from mindspore import Tensor

    from ..models.eagle3 import Eagle3DraftHead

    head = Eagle3DraftHead(cfg, batch_size=1, max_len=8)
    rng = np.random.default_rng(seed)
    for name, p in head.weight_parameters().items():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            continue
        if name.endswith(".weight") and len(p.shape) == 2 and name != "lm_head.weight":
            p.set_data(Tensor(rng.normal(0.0, 0.02, p.shape).astype(np.float32)))
    tparams = teacher_cell.weight_parameters()
    table = tparams["model.embed_tokens.weight"].asnumpy()
    # the teacher's output embedding [V, H]: the tied table, or its own lm_head (stored [H, V] like every Linear)
    out_emb = tparams["lm_head.weight"].asnumpy().T if "lm_head.weight" in tparams else table
    lm = out_emb[vocab.target_ids]  # [Vd, H]
    head.lm_head.weight.set_data(Tensor(np.ascontiguousarray(lm.T).astype(np.float32)))
    head.norm.weight.set_data(Tensor(tparams["model.norm.weight"].asnumpy().astype(np.float32)))
    if cfg.has_vocab_map:
        head.set_vocab_map(vocab.d2t, vocab.t2d)
    return head, table


def _loaded(seqs) -> list[Sequence_]:
    """The batch's sequences with their rows in memory (``StoredSequence`` is read from its shard now)."""
    return [x.load() if isinstance(x, StoredSequence) else x for x in seqs]


def fixed_sample(seqs: list, limit: int) -> list:
    """At most ``limit`` of ``seqs`` (the held-out split, or the training split for ``--train-eval-max``), the
    same ones on every run and resume (the lowest id hashes): evaluating all of a 2M-token set's held-out split
    would cost minutes per evaluation."""
    if limit <= 0 or len(seqs) <= limit:
        return list(seqs)
    return sorted(seqs, key=lambda s: hashlib.sha1(s.pid.encode()).hexdigest())[:limit]


class Plateau:
    """Stop rule on the held-out simulated tau, a trend test: stop when the least-squares line through the last
    ``patience + 1`` evaluations (tau against step) gains no more than ``min_delta`` across them (``patience`` 0:
    never). Why a trend and not "no new best by ``min_delta``": held-out tau moves by less than its own noise late in
    a run (a depth-3 tau on 20k positions has a standard error near 0.007), so one lucky evaluation made the old
    rule stop a run whose loss and tau were still rising (results/head-training/continuation-1m6: stopped at step
    500 of a curve that gained +0.014 more). State is the evaluation history, so a resumed run continues."""

    def __init__(self, patience: int, min_delta: float):
        if patience < 0 or min_delta < 0:
            raise ConfigError(f"--patience {patience} / --min-delta {min_delta}: must be >= 0")
        self.patience, self.min_delta = patience, min_delta

    def reached(self, history: list[dict]) -> bool:
        if not self.patience or len(history) <= self.patience:
            return False
        window = history[-(self.patience + 1):]
        steps = np.array([h["step"] for h in window], np.float64)
        taus = np.array([h["tau"] for h in window], np.float64)
        span = steps[-1] - steps[0]
        if span <= 0:
            return False
        x = steps - steps.mean()
        slope = float((x * (taus - taus.mean())).sum() / (x * x).sum())
        return slope * span <= self.min_delta


def _first_answer_tokens(seqs: list, limit: int) -> list:
    """The shortest prefix of ``seqs`` (in data order: every category progresses together, see ``train.data``)
    holding at least ``limit`` answer tokens, whole conversations only: a smaller data set of the same mix."""
    if limit <= 0:
        raise ConfigError(f"--max-answer-tokens {limit}: must be > 0")
    out, total = [], 0
    for s in seqs:
        if total >= limit and conversation_id(s.pid) != conversation_id(out[-1].pid):
            break
        out.append(s)
        total += len(s.tokens) - s.prompt_len
    return out


def _count_candidates(seqs: list, vocab_size: int) -> np.ndarray:
    """How often each id is among the teacher's stored top-k, read shard by shard (never all rows at once)."""
    counts = np.zeros(vocab_size, np.int64)
    by_shard: dict[int, tuple] = {}
    for s in seqs:
        if isinstance(s, StoredSequence):
            by_shard.setdefault(id(s.shard), (s.shard, []))[1].append(s)
        else:
            counts += count_tokens([s.topk_ids], vocab_size)
    for shard, members in by_shard.values():
        topk = shard.array("topk_ids")
        bad = first_out_of_vocab(topk, vocab_size)
        if bad is not None:
            raise DataError(f"{shard.path}: top-k token id {int(topk.reshape(-1)[bad])} (row {bad // topk.shape[1]}) "
                            f"is outside the teacher's vocabulary [0, {vocab_size}): the data of another model or a "
                            "damaged shard; regenerate it")
        counts += count_tokens([topk[s.row:s.row + len(s.tokens) - 1] for s in members], vocab_size)
    return counts


def _read_init_head(path: str, tcfg):
    """``(weights in our layout, its DraftVocab)`` of a head to start from, refused unless it drafts for a
    teacher of this shape (hidden size, heads, aux taps)."""
    from ..convert.eagle3 import read_checked_head

    cfg, tensors, d2t, _ = read_checked_head(path)
    if (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) != (
            tcfg.hidden_size, tcfg.num_heads, tcfg.num_kv_heads, tcfg.vocab_size) or (
            cfg.aux_layer_ids and tuple(cfg.aux_layer_ids) != tuple(tcfg.aux_layer_ids)):
        raise ConfigError(f"--init-head {path}: its shape (hidden {cfg.hidden_size}, heads {cfg.num_heads}/"
                          f"{cfg.num_kv_heads}, vocab {cfg.vocab_size}, taps {cfg.aux_layer_ids}) is not this "
                          f"teacher's head shape")
    vocab = (DraftVocab.from_d2t(d2t, cfg.vocab_size) if d2t is not None
             else DraftVocab.from_target_ids(range(cfg.vocab_size), cfg.vocab_size))
    return tensors, vocab


_WIDENED = {"midlayer.mlp.gate_proj.weight": 1, "midlayer.mlp.up_proj.weight": 1, "midlayer.mlp.down_proj.weight": 0}


def _init_intermediate(init) -> int:
    """The MLP width of a head to start from (ours: ``gate_proj`` is ``[H, I]``)."""
    return int(np.asarray(init[0]["midlayer.mlp.gate_proj.weight"]).shape[1])


def _start_from(head, init, vocab: DraftVocab) -> None:
    """Copy ``init``'s weights into ``head``; ``lm_head`` columns (ours ``[H, Vd]``) by target id.

    A head wider than ``init`` (``--head-intermediate``) is a function-preserving widening: ``init``'s MLP units
    fill the first ``I_old`` units, the new units keep ``init_head``'s random gate/up and get a zero
    down-projection, so the widened head drafts exactly as ``init`` until training moves them (the capacity
    experiment of issue 17: does a wider head gain from a head already at its plateau?)."""
    from mindspore import Tensor

    tensors, old = init
    params = head.weight_parameters()
    for name, p in params.items():
        if name == "lm_head.weight":
            lm = p.asnumpy()  # columns = the teacher's output embedding rows (init_head)
            shared = old.draft_of[vocab.target_ids]  # old draft id of each new draft id, -1 if absent
            hit = shared >= 0
            trained = np.asarray(tensors[name], np.float32)[:, shared[hit]]
            # A trained column is its teacher row plus a learned shift with a large common part; a new id's
            # column gets that common part too, else it scores on another scale than the trained ones (measured:
            # held-out acc_0 0.013 at step 0 without it, half the ids new).
            if hit.any() and not hit.all():
                lm[:, ~hit] += (trained - lm[:, hit]).mean(axis=1, keepdims=True)
            lm[:, hit] = trained
            p.set_data(Tensor(lm))
        elif name in tensors:
            arr = np.asarray(tensors[name], np.float32)
            axis = _WIDENED.get(name)
            if axis is not None and arr.shape[1 - axis] == p.shape[1 - axis] and arr.shape[axis] < p.shape[axis]:
                wide = p.asnumpy()  # the new units: init_head's random gate/up, a zero down-projection
                if axis == 1:
                    wide[:, :arr.shape[1]] = arr
                else:
                    wide[:arr.shape[0]] = arr
                    wide[arr.shape[0]:] = 0.0
                arr = wide
            if arr.shape != tuple(p.shape):
                raise ConfigError(f"--init-head: {name} has shape {arr.shape}, this head needs {tuple(p.shape)}")
            p.set_data(Tensor(arr))
    print(f"initialised from the head ({int((old.draft_of[vocab.target_ids] >= 0).sum())} of {vocab.size} "
          f"draft ids shared)", file=sys.stderr)


def data_digest(data_dir: str) -> str:
    """sha256 of the data's manifest: which shards and conversations it lists (a shard is written once and never
    rewritten, so more or other data changes the digest)."""
    with open(os.path.join(data_dir, MANIFEST), "rb") as f:
        # up to its last complete record: a torn tail (an interrupted append, dropped by ``read_manifest`` and
        # removed when generation resumes) is not data, so it must not make the same data look like other data
        return "sha256:" + hashlib.sha256(f.read(manifest_good_bytes(data_dir))).hexdigest()


def _check_data_teacher(data_dir: str, teacher_fp: str) -> None:
    """Refuse data that records another teacher: a head must learn what *this* teacher outputs."""
    recorded = read_identity(data_dir)
    if recorded is None:
        print(f"note: {data_dir} records no teacher (written before data directories did): assumed to hold this "
              "teacher's answers", file=sys.stderr)
    elif recorded.get("teacher") != teacher_fp:
        raise IdentityError(f"data directory {data_dir} holds the answers of another teacher ({recorded.get('teacher')}"
                            f"; this teacher is {teacher_fp}): train on this teacher's own data (another --data, or "
                            f"none: the default data directory is per teacher)")


def peak_rss_gb() -> float:
    """Peak resident memory of this process (GB), from ``/proc/self/status`` ``VmHWM`` (0 where unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1e6, 2)
    except OSError:
        pass
    return 0.0


class WarmupCosine:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to ``lr * floor`` at ``total``."""

    def __init__(self, lr: float, warmup: int, total: int, floor: float = 0.1):
        self.lr, self.warmup, self.total, self.floor = lr, max(1, warmup), max(total, warmup + 1), floor

    def __call__(self, step: int, time_frac: float = 0.0) -> float:
        """``time_frac``: the fraction of a wall-clock budget already spent; the decay follows whichever of
        steps or time runs out first, so a time-limited run still ends at the low learning rate."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = min(1.0, max((step - self.warmup) / (self.total - self.warmup), time_frac))
        return self.lr * (self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * frac)))


class Trainer:
    """Owns the head, the loss cell, the optimizer and the compiled step; ``fit`` runs until a step or time limit."""

    def __init__(self, head, embed_table: np.ndarray, vocab: DraftVocab, steps: int = 7, lr: float = 3e-4,
                 weight_decay: float = 0.0, clip: float = 0.5, warmup: int = 50, total_steps: int = 2000,
                 jit: bool = True):
        import mindspore as ms
        from mindspore import Tensor, nn, ops

        self.head, self.vocab, self.steps = head, vocab, steps
        self.loss_cell = TTTLoss(head, embed_table, steps)
        self.params = [p for p in head.weight_parameters().values() if p.requires_grad]
        self.schedule = WarmupCosine(lr, warmup, total_steps)
        self.opt = nn.AdamWeightDecay(self.params, learning_rate=Tensor(np.float32(self.schedule(0))),
                                      weight_decay=weight_decay, beta2=0.95)
        grad_fn = ms.value_and_grad(self.loss_cell, None, self.opt.parameters, has_aux=True)
        opt, clip_norm = self.opt, float(clip)

        lr_param = self.opt.learning_rate

        def train_step(lr, *inputs):
            # The learning rate enters as an input and is assigned inside the step: ``Parameter.set_data`` from
            # the host after the graph was compiled is not seen by it (the graph keeps the first value).
            ops.assign(lr_param, lr)
            (loss, stats), grads = grad_fn(*inputs)
            grads = ops.clip_by_global_norm(grads, clip_norm)
            opt(grads)
            return loss, stats

        self._train_step = ms.jit(train_step) if jit else train_step
        self._eval = ms.jit(self.loss_cell) if jit else self.loss_cell
        self.step = 0

    # ---- one batch ------------------------------------------------------------------------------------
    def train_batch(self, t: int, seqs: list[StoredSequence] | list[Sequence_], prompt_loss: bool = False,
                    time_frac: float = 0.0):
        from mindspore import Tensor

        lr = Tensor(np.float32(self.schedule(self.step, time_frac)))
        arrays = pack_batch(_loaded(seqs), self.vocab, t, self.steps, prompt_loss)
        loss, (losses, correct, counts) = self._train_step(lr, *[Tensor(a) for a in arrays])
        self.step += 1
        return float(loss.asnumpy()), losses.asnumpy(), correct.asnumpy(), counts.asnumpy()

    def evaluate(self, batches) -> dict:
        """Held-out ``acc_k`` (per TTT step), mean loss and simulated tau."""
        return _summary(self._sums(batches))

    def evaluate_groups(self, groups: dict[str, list]) -> dict:
        """``evaluate`` over the batches of every group together, plus ``by_source`` (the same figures per group)
        when there are several: each batch is evaluated once."""
        sums = {name: self._sums(batches) for name, batches in groups.items()}
        out = _summary(tuple(sum(s[i] for s in sums.values()) for i in range(4)))
        if len(sums) > 1:
            out["by_source"] = {name: _summary(s) for name, s in sums.items()}
        return out

    def _sums(self, batches) -> tuple[np.ndarray, np.ndarray, float, int]:
        """(correct per TTT step, positions per step, summed batch loss, batches)."""
        from mindspore import Tensor

        self.loss_cell.set_train(False)
        correct = np.zeros(self.steps)
        counts = np.zeros(self.steps)
        loss_sum, n = 0.0, 0
        for t, seqs in batches:
            arrays = pack_batch(_loaded(seqs), self.vocab, t, self.steps)
            loss, (_, c, m) = self._eval(*[Tensor(a) for a in arrays])
            loss_sum += float(loss.asnumpy())
            n += 1
            correct += c.asnumpy()
            counts += m.asnumpy()
        self.loss_cell.set_train(True)
        return correct, counts, loss_sum, n

    # ---- checkpoints ------------------------------------------------------------------------------------
    def save(self, run_dir: str, name: str, with_optimizer: bool = True) -> None:
        params = list(self.head.weight_parameters().values())
        if with_optimizer:
            names = {p.name for p in params}
            params += [p for p in self.opt.get_parameters() if p.name not in names]
        save_tensors({p.name: p.asnumpy() for p in params}, os.path.join(run_dir, name))

    def restore(self, path: str) -> None:
        from mindspore import Tensor

        targets = dict(self.head.weight_parameters())
        targets.update({p.name: p for p in self.opt.get_parameters()})
        missing = sorted(set(targets) - set(tensor_shapes(path)))
        if missing:
            raise CheckpointError(f"{path}: checkpoint lacks {missing[:8]} (not a checkpoint of this run?)")
        for name, arr in load_tensors(path, targets).items():
            p = targets[name]
            if arr.size != int(np.prod(p.shape)):
                raise CheckpointError(f"{path}: {name} has shape {arr.shape}, expected {tuple(p.shape)}")
            p.set_data(Tensor(arr.reshape(p.shape)).astype(p.dtype))  # 0-d scalars come back as [1]


def _summary(sums) -> dict:
    correct, counts, loss_sum, n = sums
    acc = correct / np.maximum(counts, 1)
    return {"loss": loss_sum / max(n, 1), "acc": [round(float(a), 4) for a in acc],
            "tau": round(simulated_tau(acc), 4), "positions": int(counts[0])}


def _progress(step: int, total: int, el: float, loss: float, acc: np.ndarray, extra: str = "") -> None:
    bar = "#" * int(25 * step / max(total, 1))
    accs = " ".join(f"{a:.2f}" for a in acc[:4])
    print(f"\r[{bar:<25}] step {step}/{total} loss {loss:.3f} acc[0:4] {accs} {el / 60:.1f} min {extra}   ",
          end="", file=sys.stderr, flush=True)


def check_train_flags(argv: list[str] | None) -> TrainConfig:
    """The run's ``TrainConfig`` from the command line (and ``--config``), every value range-checked before anything
    is read, loaded or written (``TrainConfig.check``)."""
    return TrainConfig.from_args(build_parser().parse_args(argv))


def head_params(tcfg, intermediate: int, draft_vocab: int) -> int:
    """Trained parameters of a head for teacher ``tcfg``: ``fc`` (3H -> H), attention over ``[embedding,
    hidden]`` (2H in), the MLP (3 x H x I), the norms and the ``lm_head`` (H x draft vocabulary)."""
    h, q, kv = tcfg.hidden_size, tcfg.num_heads * tcfg.head_dim, tcfg.num_kv_heads * tcfg.head_dim
    return 3 * h * h + 2 * h * (q + 2 * kv) + q * h + 3 * h * intermediate + 4 * h + h * draft_vocab


def check_train_fits(a: TrainConfig, tcfg, buckets: tuple[int, ...]) -> None:
    """Refuse, before data generation and before the teacher loads, what this teacher cannot train: positions
    past its rotary table, and a head, optimizer and one batch that need more memory than this machine has (a
    lower bound: ``--head-intermediate 100000000`` died in a numpy allocation after the data was read)."""
    last = buckets[-1] + a.ttt_steps - 2  # entry i sits at position i + k at TTT step k (train.ttt)
    if last >= tcfg.max_position_embeddings:
        raise ConfigError(f"--ttt-steps {a.ttt_steps} with --buckets {_csv(a.buckets)}: training reaches position "
                          f"{last}, past the teacher's positions 0..{tcfg.max_position_embeddings - 1} "
                          "(max_position_embeddings); use a smaller largest bucket or fewer TTT steps")
    intermediate = a.head_intermediate or tcfg.intermediate_size
    vocab = min(a.draft_vocab, tcfg.vocab_size)
    # weights, gradients and AdamW's two moments in fp32, the frozen embedding table once
    state = 4 * (4 * head_params(tcfg, intermediate, vocab) + tcfg.vocab_size * tcfg.hidden_size)
    # one evaluation batch holds at least one sequence padded to the largest bucket: per TTT step and entry, the
    # logits with their log-softmax and gradient, and the MLP's gate, up and product (more sequences per batch only
    # add to it, as far as the data has them)
    batch = 4 * a.ttt_steps * buckets[-1] * 3 * (vocab + intermediate)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if state + batch > total:
        raise ConfigError(f"--head-intermediate {intermediate} / --draft-vocab {a.draft_vocab} / --ttt-steps "
                          f"{a.ttt_steps} / --buckets {_csv(a.buckets)}: training needs at least "
                          f"{(state + batch) / 2 ** 30:.1f} GiB (head and optimizer state {state / 2 ** 30:.1f} GiB, "
                          f"one sequence's batch {batch / 2 ** 30:.1f} GiB), more than this machine's "
                          f"{total / 2 ** 30:.1f} GiB; use smaller values")


def _csv(values) -> str:
    return ",".join(map(str, values))


def split_data(a: TrainConfig, data_dir: str, tcfg) -> tuple[list, dict[str, list]]:
    """Stage 1: the data's sequences (features left on disk: a batch reads its rows, ``data.ShardFile``), checked
    against the teacher, split by conversation hash into training and held-out, the held-out split per prompt
    source (ShareGPT, synthetic), each sampled alike (a tau per source)."""
    seqs = index_sequences(data_dir)
    check_token_ids(seqs, tcfg.vocab_size)  # before any count: numpy would index with them (or drop them)
    check_shapes(seqs, tcfg.hidden_size)  # before any graph: MindSpore's Reshape would be the first to notice
    train = [s for s in seqs if not heldout(s.pid, a.heldout)]
    groups: dict[str, list] = {}
    for s in seqs:
        if heldout(s.pid, a.heldout):
            groups.setdefault(source_of(s.pid), []).append(s)
    groups = {src: fixed_sample(g, a.heldout_max) for src, g in sorted(groups.items())}
    if a.max_answer_tokens is not None:
        train = _first_answer_tokens(train, a.max_answer_tokens)
    held = sum(len(g) for g in groups.values())
    if not train or not held:
        raise ConfigError(f"{data_dir}: {len(train)} training / {held} held-out sequences; need both "
                          f"(more data or another --heldout)")
    return train, groups


def draft_vocabulary(a: TrainConfig, init, train: list, tcfg, run_dir: str) -> DraftVocab:
    """Stage 2: the head's draft vocabulary -- ``--init-head``'s (``--vocab-from-head``), the run's own (a resume), or
    the ``--draft-vocab`` ids the training split shows most (answers and the teacher's top-k candidates) -- saved
    in the run directory."""
    vocab_path = os.path.join(run_dir, VOCAB_FILE)
    if a.vocab_from_head:
        vocab = init[1]
    elif os.path.isfile(vocab_path):
        return DraftVocab.from_d2t(np.load(vocab_path)["d2t"], tcfg.vocab_size)
    else:
        counts = count_tokens([s.tokens[s.prompt_len:] for s in train], tcfg.vocab_size)
        cand = _count_candidates(train, tcfg.vocab_size)  # the teacher's top-k candidates
        seen = int(((counts > 0) | (cand > 0)).sum())  # ids the data ever shows: answers or top-k candidates
        size = min(a.draft_vocab, seen)
        if size < a.draft_vocab:
            print(f"draft vocab {a.draft_vocab} > the {seen} distinct ids the data shows: using {size}",
                  file=sys.stderr)
        vocab = build_draft_vocab(counts, size, tcfg.eos_token_ids, cand)
    np.savez(vocab_path, d2t=vocab.d2t)
    return vocab


def train_draft_main(argv: list[str] | None = None) -> int:
    a = check_train_flags(argv)  # before anything is read, loaded or written
    buckets = a.buckets
    os.environ.setdefault("GLOG_v", "3")
    from ..storage.assets import default_model_dir
    from ..runtime import RuntimeConfig
    from ..teacher_config import TeacherConfig
    from ..draft_config import DraftConfig
    from ..teacher import Teacher
    from .data import default_data_dir, generate_dataset
    from .export import export_head, is_exported_head

    teacher_dir = a.teacher or default_model_dir()
    if not os.path.isdir(teacher_dir):
        raise ConfigError(f"teacher {teacher_dir}: no such directory; pass --teacher DIR (a converted teacher) or "
                          "install the default one with `mindspore-eagle setup`")
    teacher_fp = directory_fingerprint(teacher_dir)
    data_dir = a.data or default_data_dir(teacher_dir, teacher_fp)
    run_dir = a.run_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)),
                                        ".train-run-" + os.path.basename(os.path.normpath(a.out)))
    protected = (teacher_dir, data_dir, run_dir)  # the export replaces OUT: it must not hold any of these
    # Before any work: OUT and the run directory are the user's unless empty or the trainer's own.
    check_output_dir(a.out, a.overwrite or is_exported_head(a.out), ConfigError, protected)
    if not a.export_only:
        check_claimable(run_dir, "run directory", RUN_REMEDY, restart=a.overwrite)
    tcfg = TeacherConfig.load(teacher_dir)  # its config only: nothing is loaded yet
    check_train_fits(a, tcfg, buckets)
    if not os.path.isfile(os.path.join(data_dir, MANIFEST)):
        generate_dataset(teacher_dir, data_dir, a.num_prompts)
    _check_data_teacher(data_dir, teacher_fp)
    plateau = Plateau(a.patience, a.min_delta)
    train, held_groups = split_data(a, data_dir, tcfg)
    held = [s for g in held_groups.values() for s in g]

    init = _read_init_head(a.init_head, tcfg) if a.init_head else None
    init_width = _init_intermediate(init) if init is not None else None
    intermediate = a.head_intermediate or init_width or tcfg.intermediate_size
    if init_width is not None and intermediate < init_width:
        raise ConfigError(f"--head-intermediate {intermediate}: --init-head {a.init_head} is {init_width} wide; "
                          f"a trained head can be widened, not narrowed")
    identity = {"kind": "train-run", "teacher": teacher_fp, "data": data_digest(data_dir),
                "max_answer_tokens": a.max_answer_tokens, "heldout": a.heldout, "heldout_max": a.heldout_max,
                "draft_vocab": a.draft_vocab, "vocab_from_head": a.vocab_from_head,
                "init_head": directory_fingerprint(a.init_head) if a.init_head else None,
                "head_intermediate": intermediate, "ttt_steps": a.ttt_steps, "buckets": list(buckets),
                "tokens_per_batch": a.tokens_per_batch, "lr": a.lr, "warmup": a.warmup, "clip": a.clip,
                "prompt_loss": a.prompt_loss, "seed": a.seed}
    if a.export_only:  # trains nothing: only what shapes the exported head must agree
        os.makedirs(run_dir, exist_ok=True)
        recorded = read_identity(run_dir)
        changes = mismatch(recorded, identity, EXPORT_KEYS) if recorded is not None else ""
        if changes:
            raise IdentityError(f"run directory {run_dir} trained another head ({changes}); export it with the "
                                "teacher and --head-intermediate it was trained with")
    else:
        claim(run_dir, identity, "run directory", RUN_REMEDY, restart=a.overwrite, owned=RUN_FILES)
    vocab = draft_vocabulary(a, init, train, tcfg, run_dir)
    held_counts = count_tokens([s.tokens[s.prompt_len:] for s in held], tcfg.vocab_size)
    n_tok = sum(len(s.tokens) - s.prompt_len for s in train)
    n_pos = sum(len(s.tokens) for s in train)  # every position a training sequence offers (answers and prompts)
    print(f"data: {len(train)} train / {len(held)} held-out sequences, {n_tok} answer tokens; draft vocab "
          f"{vocab.size}, held-out coverage {coverage(held_counts, vocab):.4f}", file=sys.stderr)
    data_info = {"train_sequences": len(train), "train_answer_tokens": int(n_tok), "train_positions": int(n_pos),
                 "heldout_sequences": len(held),
                 "draft_vocab": vocab.size, "heldout_coverage": round(coverage(held_counts, vocab), 4)}

    cfg = DraftConfig(hidden_size=tcfg.hidden_size, intermediate_size=intermediate,
                      num_heads=tcfg.num_heads, num_kv_heads=tcfg.num_kv_heads, vocab_size=tcfg.vocab_size,
                      draft_vocab_size=vocab.size, target_hidden_size=tcfg.hidden_size, head_dim=tcfg.head_dim,
                      rms_norm_eps=tcfg.rms_norm_eps, rope_theta=tcfg.rope_theta, rope_scaling=tcfg.rope_scaling,
                      max_position_embeddings=tcfg.max_position_embeddings, aux_layer_ids=tcfg.aux_layer_ids)
    teacher = Teacher.load(teacher_dir, RuntimeConfig(max_cache_len=64, batch_size=1, buckets=(1,), prefill_chunk=1))
    head, table = init_head(cfg, teacher.cell, vocab, a.seed)
    del teacher
    if init is not None:
        _start_from(head, init, vocab)
    rng = np.random.default_rng(a.seed)
    per_epoch = len(make_batches(train, buckets, a.tokens_per_batch, rng))
    total = max(1, int(a.epochs * per_epoch))
    if a.max_steps is not None:  # >= 0 (check_train_flags)
        total = min(total, a.max_steps)
    trainer = Trainer(head, table, vocab, a.ttt_steps, a.lr, clip=a.clip, warmup=a.warmup, total_steps=total)
    state_path = os.path.join(run_dir, STATE_FILE)
    state = {"step": 0, "best_tau": -1.0, "history": []}
    if os.path.isfile(os.path.join(run_dir, LAST_FILE)) and os.path.isfile(state_path):
        with open(state_path) as f:
            state = json.load(f)
        trainer.restore(os.path.join(run_dir, LAST_FILE))
        trainer.step = state["step"]
        print(f"resumed from step {trainer.step}", file=sys.stderr)

    def do_export():
        best = os.path.join(run_dir, BEST_FILE)
        if os.path.isfile(best):
            weights = load_tensors(best, head.weight_parameters())
        else:
            weights = {n: p.asnumpy() for n, p in head.weight_parameters().items()}
        export_head(a.out, cfg, weights, vocab.d2t, vocab.t2d, dtype=a.dtype,
                    overwrite=a.overwrite or is_exported_head(a.out), sources=protected)
        print(f"exported {a.out} (best held-out: {state.get('best')})", file=sys.stderr)

    if a.export_only:
        do_export()
        return 0
    # held-out batches all at the largest bucket: one evaluation graph (each compiled graph keeps its buffers)
    held_batches = {src: make_batches(g, buckets[-1:], a.tokens_per_batch, rng, shuffle=False)
                    for src, g in held_groups.items()}
    # the same selection rule on the training split: a fixed sample, the same graph
    train_batches = (make_batches(fixed_sample(train, a.train_eval_max), buckets[-1:], a.tokens_per_batch, rng,
                                  shuffle=False) if a.train_eval_max else None)

    def checkpoint(evaluate: bool) -> None:
        if evaluate:
            ev = trainer.evaluate_groups(held_batches)
            ev["step"] = trainer.step
            ev["seconds"] = round(clock.tick(), 1)
            if train_batches is not None:
                tr = trainer.evaluate(train_batches)
                ev["train"] = {"loss": tr["loss"], "acc": tr["acc"], "tau": tr["tau"], "positions": tr["positions"]}
            ev["peak_rss_gb"] = peak_rss_gb()
            state["history"].append(ev)
            gap = f" (train sample tau {ev['train']['tau']})" if "train" in ev else ""
            per = "".join(f", {src} {g['tau']}" for src, g in ev.get("by_source", {}).items())
            print(f"\nheld-out step {trainer.step}: loss {ev['loss']:.4f} acc_k {ev['acc']} tau {ev['tau']}{per}{gap}",
                  file=sys.stderr, flush=True)
            if ev["tau"] > state["best_tau"]:
                state["best_tau"], state["best"] = ev["tau"], ev
                trainer.save(run_dir, BEST_FILE, with_optimizer=False)
        trainer.save(run_dir, LAST_FILE)
        state["step"] = trainer.step
        state["data"] = data_info
        state["train_seconds"] = round(clock.seconds, 1)
        state["paused_seconds"] = round(clock.paused_s, 1)
        with open(state_path + ".tmp", "w") as f:
            json.dump(state, f, indent=1)
        os.replace(state_path + ".tmp", state_path)

    # the time budget and LR decay continue across resumes, and leave out the time the run was stopped (train.clock)
    clock = TrainClock(state.get("train_seconds", 0.0), state.get("paused_seconds", 0.0))
    if not state["history"]:
        checkpoint(True)  # the curve starts at the initial head (random, or --init-head)
    ema_loss, ema_acc = None, np.zeros(a.ttt_steps)
    epoch = trainer.step // per_epoch
    skip = trainer.step % per_epoch
    stop = False
    # SIGTERM only raises this flag, read after each batch: a signal never cuts a compiled step short
    terminated: list[int] = []
    with on_sigterm(lambda signum, frame: terminated.append(signum)), counting_pauses(clock):
        while trainer.step < total and not stop:
            erng = np.random.default_rng(a.seed + 1000 + epoch)  # same order per epoch on resume
            for t, batch in make_batches(train, buckets, a.tokens_per_batch, erng)[skip:]:
                frac = clock.seconds / (60 * a.time_limit_min) if a.time_limit_min else 0.0
                loss, _, c, m = trainer.train_batch(t, batch, a.prompt_loss, frac)
                clock.tick()  # once per step: a pause counts as one step (train.clock)
                acc = c / np.maximum(m, 1)
                ema_loss = loss if ema_loss is None else 0.95 * ema_loss + 0.05 * loss
                ema_acc = 0.95 * ema_acc + 0.05 * acc if trainer.step > 1 else acc
                _progress(trainer.step, total, clock.seconds, ema_loss, ema_acc, f"epoch {epoch}")
                if terminated:
                    print(f"\nSIGTERM: stopping after step {trainer.step}", file=sys.stderr, flush=True)
                    state["stopped_by"] = "signal"
                    stop = True
                    break
                timed_out = a.time_limit_min is not None and clock.seconds > 60 * a.time_limit_min
                if trainer.step % a.eval_every == 0 or trainer.step >= total or timed_out:
                    checkpoint(True)
                elif trainer.step % a.ckpt_every == 0:
                    checkpoint(False)
                if trainer.step >= total or timed_out:
                    state["stopped_by"] = "steps" if trainer.step >= total else "time"
                    stop = True
                    break
                if trainer.step % a.eval_every == 0 and plateau.reached(state["history"]):
                    print(f"\nheld-out tau plateaued ({a.patience} evaluations without +{a.min_delta}): stopping",
                          file=sys.stderr)
                    state["stopped_by"] = "plateau"
                    stop = True
                    break
            epoch += 1
            skip = 0
    if terminated:  # the session is ending: save and export now, no evaluation
        checkpoint(False)
    elif not state["history"] or state["history"][-1]["step"] != trainer.step:
        checkpoint(True)
    else:
        checkpoint(False)  # the last evaluation is of this step; the state still records why the run stopped
    do_export()
    return 0


if __name__ == "__main__":
    raise SystemExit(train_draft_main(sys.argv[1:]))
