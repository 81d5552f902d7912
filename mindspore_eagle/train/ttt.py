"""The training forward of an EAGLE-3 head and the training-time-test (TTT) objective.

Why a second forward: ``Eagle3DraftHead`` runs over its static KV cache (inference). Training runs whole
sequences with no cache and unrolls K draft steps, so ``TTTLoss`` reuses the head's *Parameters* (same
objects, same names: the trained weights are the head's) and does its own attention.

Notation for one sequence (``T`` entries; arrays of *positions* are ``T + K`` long, padded at the end):

    entry i      token at position i + 1 with teacher features at position i (EAGLE's shift, as
                 ``draft.proposer``): its step-0 output predicts the token at i + 2.
    step k       draft depth k + 1. Input of entry i at step k: the token at position i + 1 + k and the hidden
                 ``out_{k-1}[i]`` (the head's own recycled, pre-norm output of step k - 1; ``fc(features[i])`` at
                 step 0). Target: the teacher's distribution at position i + 1 + k (it scores token i + 2 + k).
    attention    entry i at step k sees the step-0 keys of entries j <= i (the real context) and its own keys
                 of steps 1..k (its ancestors in the draft chain, and itself); rotary position i + k.

This is exactly what inference does (``draft.grow``: a depth-d node sits at position L + d - 1 and sees the
committed rows plus its ancestors). The reference TTT (SafeAILab ``traineagle3/cnets.py``) differs in two
details that we do not copy: it keeps position i at every step and, from step 1 on, hides the step-0 key of
entry i itself; matching our own inference is what matters for acceptance.

Loss at step k: soft cross-entropy ``-sum_v p_teacher(v) log q_k(v)`` over the draft vocabulary, where
``p_teacher`` is the softmax of the teacher's logits restricted to draft-vocabulary ids (from the stored
top-k, see ``train.data``), on positions whose teacher argmax lies in the draft vocabulary (``loss_mask``);
the mean over those positions, weighted ``decay**k`` (0.8) and summed over steps.
Accuracy at step k: the head's argmax (a draft id) equals the teacher's greedy token, over all answer
positions (``acc_mask``; a teacher token outside the draft vocabulary counts as a miss).
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..errors import DataError
from ..models.eagle3 import Eagle3DraftHead
from ..models.layers import apply_rope
from .data import first_out_of_vocab


class TTTLoss(nn.Cell):
    """``construct(ids, features, tgt_idx, tgt_p, loss_mask, acc_mask, tgt_argmax) -> (loss, (step_losses,
    step_correct, step_counts))``.

    Shapes (``B`` sequences, ``T`` entries, ``K`` steps, ``k`` stored top-k, ``H_t`` teacher width):
    ``ids [B, T+K]`` int32 tokens by position; ``features [B, T, 3H_t]``; ``tgt_idx [B, T+K, k]`` int32 draft
    ids of the teacher's top-k at each position (0 where not in the draft vocabulary, with probability 0);
    ``tgt_p [B, T+K, k]`` their restricted, renormalised probabilities; ``loss_mask, acc_mask [B, T+K]``
    float; ``tgt_argmax [B, T+K]`` int32 draft id of the teacher's greedy token (-1 outside).
    The embedding table is the teacher's and frozen (``embed``, not trained).
    """

    def __init__(self, head: Eagle3DraftHead, embed_table: np.ndarray, steps: int = 7, decay: float = 0.8):
        super().__init__(auto_prefix=False)  # keep the head's parameter names
        cfg = head.cfg
        self.head = head
        self.steps = steps
        self.decay = decay
        self.embed = Parameter(Tensor(np.asarray(embed_table, np.float32)), name="teacher_embed",
                               requires_grad=False)
        attn = head.midlayer.self_attn
        self.nh, self.nkv, self.d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.rep = self.nh // self.nkv
        self.scale = 1.0 / math.sqrt(self.d)
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.log_softmax = nn.LogSoftmax(-1)
        self.hidden_size = cfg.hidden_size

    def _proj(self, x):
        """q, k, v of ``x [B, T, 2H]``: ``q [B, Hkv, rep, T, D]``, ``k, v [B, Hkv, T, D]`` (before rotary)."""
        attn = self.head.midlayer.self_attn
        b, t, _ = x.shape
        q = attn.q_proj(x).reshape(b, t, self.nh, self.d).transpose(0, 2, 1, 3)  # [B, H, T, D]
        k = attn.k_proj(x).reshape(b, t, self.nkv, self.d).transpose(0, 2, 1, 3)
        v = attn.v_proj(x).reshape(b, t, self.nkv, self.d).transpose(0, 2, 1, 3)
        return q, k, v

    def _step(self, k_idx, embeds, hidden, cos, sin, causal, keys, values):
        """One TTT step. ``keys/values``: lists of ``[B, Hkv, T, D]`` of steps 0..k-1 (rotated). Returns
        ``(out [B, T, H], k, v)`` with this step's rotated key/value appended by the caller."""
        layer = self.head.midlayer
        b, t, _ = hidden.shape
        x = ops.concat((layer.input_layernorm(embeds), layer.hidden_norm(hidden)), -1)  # [B, T, 2H]
        q, k, v = self._proj(x)
        q = apply_rope(q, cos, sin).reshape(b, self.nkv, self.rep * t, self.d)  # group folded into rows
        k = apply_rope(k, cos, sin)
        k0 = k if k_idx == 0 else keys[0]
        v0 = v if k_idx == 0 else values[0]
        s0 = self.qk(q, k0) * self.scale  # [B, Hkv, rep*T, T]: step-0 keys, causal
        s0 = (s0.reshape(b, self.nkv, self.rep, t, t) + causal).reshape(b, self.nkv, self.rep * t, t)
        diag_k = keys[1:] + [k] if k_idx > 0 else []
        diag_v = values[1:] + [v] if k_idx > 0 else []
        q5 = q.reshape(b, self.nkv, self.rep, t, self.d)
        cols = [s0]
        for kk in diag_k:  # this entry's own keys of steps 1..k: one score per row
            sd = ops.reduce_sum(q5 * kk.reshape(b, self.nkv, 1, t, self.d), -1) * self.scale  # [B, Hkv, rep, T]
            cols.append(sd.reshape(b, self.nkv, self.rep * t, 1))
        scores = ops.concat(cols, -1) if len(cols) > 1 else s0  # [B, Hkv, rep*T, T + k]
        probs = ops.softmax(scores, -1)
        out = self.pv(probs[..., :t], v0)  # [B, Hkv, rep*T, D]
        for j, vv in enumerate(diag_v):
            w = probs[..., t + j].reshape(b, self.nkv, self.rep, t, 1)
            out = out + (w * vv.reshape(b, self.nkv, 1, t, self.d)).reshape(b, self.nkv, self.rep * t, self.d)
        out = out.reshape(b, self.nh, t, self.d).transpose(0, 2, 1, 3).reshape(b, t, -1)
        h = hidden + layer.self_attn.o_proj(out)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h, k, v

    def unroll(self, ids, features):
        """The K steps' outputs: a list of recycled hiddens ``[B, T, H]`` (logits = ``head.compute_logits``)."""
        b, t, _ = features.shape
        row = ops.arange(0, t, dtype=ms.int32).reshape(t, 1)
        col = ops.arange(0, t, dtype=ms.int32).reshape(1, t)
        causal = ops.select(col <= row, ops.zeros((t, t), ms.float32), ops.fill(ms.float32, (t, t), -1e9))
        hidden = self.head.fc(features)  # [B, T, H]: step 0 reads the teacher features
        keys, values, outs = [], [], []
        for k in range(self.steps):
            tok = ids[:, k + 1:k + 1 + t]  # [B, T] token at position i + 1 + k
            embeds = ops.gather(self.embed, tok, 0)  # [B, T, H]
            pos = ops.arange(k, k + t, dtype=ms.int32)
            cos = ops.gather(self.head.cos_table, pos, 0).reshape(1, 1, t, -1)
            sin = ops.gather(self.head.sin_table, pos, 0).reshape(1, 1, t, -1)
            out, kk, vv = self._step(k, embeds, hidden, cos, sin, causal, keys, values)
            keys.append(kk)
            values.append(vv)
            outs.append(out)
            hidden = out  # step k + 1 reads this step's own output
        return outs

    def construct(self, ids, features, tgt_idx, tgt_p, loss_mask, acc_mask, tgt_argmax):
        t = features.shape[1]
        outs = self.unroll(ids, features)
        denom = ops.maximum(loss_mask[:, 1:1 + t].sum(), 1.0)
        total = ops.zeros((), ms.float32)
        losses, correct, counts = [], [], []
        for k in range(self.steps):
            logp = self.log_softmax(self.head.compute_logits(outs[k]))  # [B, T, Vd]
            idx = tgt_idx[:, k + 1:k + 1 + t]
            p = tgt_p[:, k + 1:k + 1 + t]
            m = loss_mask[:, k + 1:k + 1 + t]
            ce = -(ops.gather_d(logp, 2, idx) * p).sum(-1)  # [B, T]
            step_loss = (ce * m).sum() / denom
            total = total + (self.decay ** k) * step_loss
            pred = ops.argmax(logp, -1).astype(ms.int32)
            am = acc_mask[:, k + 1:k + 1 + t]
            hit = ops.equal(pred, tgt_argmax[:, k + 1:k + 1 + t]).astype(ms.float32) * am
            losses.append(step_loss)
            correct.append(hit.sum())
            counts.append(am.sum())
        return total, (ops.stack(losses), ops.stack(correct), ops.stack(counts))


def pack_batch(seqs, vocab, t: int, steps: int, prompt_loss: bool = False) -> tuple[np.ndarray, ...]:
    """Host side: pad ``seqs`` (``train.data.Sequence_``) to ``T = t`` entries and build ``TTTLoss`` inputs.

    A position p is a *target* (``acc_mask``) when the token at p + 1 is part of the teacher's answer
    (``p >= prompt_len - 1``; with ``prompt_loss`` every position) and p <= N - 2; ``loss_mask`` further needs
    the teacher's argmax at p in the draft vocabulary. Teacher top-k logits outside the draft vocabulary are
    dropped and the rest renormalised (softmax over the kept entries).
    """
    b, width = len(seqs), t + steps
    k = seqs[0].topk_ids.shape[1]
    h3 = seqs[0].features.shape[1]
    ids = np.zeros((b, width), np.int32)
    feats = np.zeros((b, t, h3), np.float32)
    tgt_idx = np.zeros((b, width, k), np.int32)
    tgt_p = np.zeros((b, width, k), np.float32)
    loss_mask = np.zeros((b, width), np.float32)
    acc_mask = np.zeros((b, width), np.float32)
    argmax = np.full((b, width), -1, np.int32)
    vocab_size = vocab.draft_of.shape[0]
    for s in seqs:  # numpy would raise IndexError on an id past the vocabulary and silently wrap a negative one
        for what, arr in (("token", s.tokens), ("top-k token", s.topk_ids)):
            bad = first_out_of_vocab(arr, vocab_size)
            if bad is not None:
                raise DataError(f"sequence {s.pid}: {what} id {int(np.asarray(arr).reshape(-1)[bad])} is outside the "
                                f"teacher's vocabulary [0, {vocab_size}): the data of another model or a damaged "
                                "shard; regenerate it")
    for j, s in enumerate(seqs):
        n = min(len(s.tokens), width)
        ids[j, :n] = s.tokens[:n]
        nf = min(s.features.shape[0], t)
        feats[j, :nf] = s.features[:nf]
        npos = min(s.topk_ids.shape[0], width)  # positions 0..N-2 carry teacher logits
        draft = vocab.draft_of[s.topk_ids[:npos]]  # [npos, k], -1 outside
        logits = s.topk_logits[:npos].astype(np.float32)
        keep = draft >= 0
        z = np.where(keep, logits, -np.inf)
        zmax = np.max(np.where(keep, z, -1e30), -1, keepdims=True)
        e = np.where(keep, np.exp(z - zmax), 0.0)
        tot = e.sum(-1, keepdims=True)
        tgt_p[j, :npos] = np.where(tot > 0, e / np.maximum(tot, 1e-30), 0.0)
        tgt_idx[j, :npos] = np.maximum(draft, 0)
        first = 0 if prompt_loss else max(s.prompt_len - 1, 0)
        target = np.zeros(npos, np.float32)
        target[first:] = 1.0
        acc_mask[j, :npos] = target
        loss_mask[j, :npos] = target * keep[:, 0]
        argmax[j, :npos] = draft[:, 0]
    return ids, feats, tgt_idx, tgt_p, loss_mask, acc_mask, argmax


def simulated_tau(acc: np.ndarray) -> float:
    """``1 + sum_k prod_{i<=k} acc_i``: expected tokens per round of a chain draft with per-step acceptance acc."""
    return float(1.0 + np.cumprod(np.asarray(acc, np.float64)).sum())


__all__ = ["TTTLoss", "pack_batch", "simulated_tau"]
