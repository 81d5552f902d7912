"""Batched training-data generation (``train.batch_greedy`` over ``train.topk_teacher``) against independent
references on a tiny random teacher: every turn's tokens equal single-sequence greedy decoding
(``SpeculativeEngine``), the stored top-k equals a numpy top-k of the full logits of one B=1 forward over the
whole sequence, the greedy token is that forward's argmax, and the features are its aux hidden states.
Covers slot refill (more conversations than slots), row reuse across conversations sharing a prefix, second
turns built on the teacher's own first answer, early EOS, and the capacity rules."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_eagle.errors import CacheCapacityError
from mindspore_eagle.evaluation.evalset import EvalItem
from mindspore_eagle.evaluation.evaluate import build_prompt

NEW = 10
K = 8
MAX_LEN = 64
SHARED = (1, 5, 9, 13)  # a common "system prompt": later conversations in a slot reuse its rows


def _items() -> list[EvalItem]:
    rng = np.random.default_rng(3)
    items = []
    for i in range(7):
        body = tuple(int(t) for t in rng.integers(3, 100, size=int(rng.integers(1, 9))))
        turns = (SHARED + body,) if i % 3 else (SHARED + body, (60, 61, int(rng.integers(3, 100))))
        items.append(EvalItem(f"c{i}", "test", turns_ids=turns))
    return items


@pytest.fixture(scope="module")
def teachers(tiny_taps_dir):
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.teacher import Teacher

    batched = Teacher.load(tiny_taps_dir, RuntimeConfig(max_cache_len=MAX_LEN, batch_size=3, buckets=(1,),
                                                        prefill_chunk=1))
    single = Teacher.load(tiny_taps_dir, RuntimeConfig(max_cache_len=MAX_LEN, batch_size=1, buckets=(1, 8, 16, 32, 64),
                                                       prefill_chunk=8))
    return batched, single


def _eos_for(single, items) -> int:
    """A token the tiny teacher actually emits early in one answer, used as EOS so some answers stop early."""
    from mindspore_eagle.engine import greedy_generate

    return int(greedy_generate(single, list(items[1].turns_ids[0]), 4).tokens[2])


@pytest.fixture(scope="module")
def generated(teachers):
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator

    batched, single = teachers
    items = _items()
    eos = _eos_for(single, items)
    gen = BatchGreedyGenerator(batched, NEW, (eos,), topk=K)
    done = []
    stats = gen.run(items, done.append)
    return items, eos, done, stats


def test_every_turn_equals_single_sequence_greedy(teachers, generated):
    from mindspore_eagle.engine import greedy_generate

    _, single = teachers
    items, eos, done, stats = generated
    assert sorted(f.item.id for f in done) == sorted(i.id for i in items)
    stopped_early = 0
    for f in done:
        answers = []
        for k in range(f.item.num_turns):
            ref = greedy_generate(single, build_prompt(f.item, k, answers, None, (eos,)), NEW, (eos,))
            assert f.answers[k] == tuple(ref.tokens), (f.item.id, k)
            answers.append(ref.tokens)
            stopped_early += ref.stop_reason == "eos"
        assert f.skipped_turns == 0
    assert stopped_early >= 1, "the test should exercise an answer that ends at EOS"
    assert stats.reused_rows >= len(SHARED) * (len(items) - 3), "later conversations reuse the shared rows"


def test_stored_topk_features_and_greedy_equal_one_full_forward(teachers, generated):
    """Each stored sequence against one B=1 forward of its whole conversation (an independent causal prefill)."""
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    _, single = teachers
    items, eos, done, _ = generated
    checked = 0
    for f in done:
        for k, seq in enumerate(f.sequences):
            prompt = build_prompt(f.item, k, list(f.answers[:k]), None, (eos,))
            full = prompt + list(f.answers[k])
            start = len(full) - len(seq.tokens)
            assert start == f.starts[k]
            assert list(seq.tokens) == full[start:] and seq.prompt_len == len(prompt) - start
            assert start == 0 if k == 0 else start > len(f.item.turns_ids[0])  # turn 2 stores its own rows only
            n = len(full) - 1
            out = single.forward(ForwardInputs.for_tree(TreeLayout.chain(full[:n]), 0, 64, MAX_LEN))
            logits = out.logits[0, start:]  # [rows, V]
            order = np.argsort(-logits, axis=-1, kind="stable")[:, :K]
            ref_vals = np.take_along_axis(logits, order, -1)
            np.testing.assert_allclose(seq.topk_logits.astype(np.float32), ref_vals, rtol=2e-3, atol=2e-3)
            gaps = np.abs(np.diff(ref_vals, axis=-1)) > 1e-3  # ids must agree where the values are distinct
            distinct = np.concatenate([gaps[:, :1], gaps[:, 1:] & gaps[:, :-1], gaps[:, -1:]], -1)
            assert np.array_equal(seq.topk_ids[distinct], order[distinct])
            p = seq.prompt_len
            assert np.array_equal(np.argmax(logits[p - 1:], -1), seq.tokens[p:])  # greedy = full-forward argmax
            np.testing.assert_allclose(seq.features.astype(np.float32), out.aux_hidden[0, start:], rtol=3e-3,
                                       atol=3e-3)
            checked += 1
    assert checked == sum(i.num_turns for i in items)


def test_a_first_turn_longer_than_the_cache_is_refused_before_generation(teachers):
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator

    gen = BatchGreedyGenerator(teachers[0], NEW, (), topk=K)
    long = EvalItem("long", "test", turns_ids=(tuple(range(3, 3 + MAX_LEN - NEW + 1)),))
    with pytest.raises(CacheCapacityError, match="long: prompt of 55 tokens"):
        gen.run([long], lambda f: None)


def test_a_second_turn_that_does_not_fit_ends_its_conversation(teachers):
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator

    gen = BatchGreedyGenerator(teachers[0], NEW, (), topk=K)
    first = tuple(range(3, 3 + MAX_LEN - NEW - 4))  # fits; + its answer + the second turn does not
    done = []
    gen.run([EvalItem("two", "test", turns_ids=(first, (7, 8)))], done.append)
    assert len(done) == 1 and done[0].skipped_turns == 1 and len(done[0].sequences) == 1


def test_should_stop_drops_conversations_in_flight(teachers):
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator

    gen = BatchGreedyGenerator(teachers[0], NEW, (), topk=K)
    done = []
    stats = gen.run(_items(), done.append, should_stop=lambda s: s.steps >= 3)
    assert stats.steps == 3 and done == []  # no conversation finishes in 3 steps; none is reported half done


def test_wrapping_keeps_the_teacher_parameter_names(teachers):
    """The trainer and the checkpoint loader find teacher weights by name; wrapping must not prefix them."""
    from mindspore_eagle.train.topk_teacher import GreedyTopK

    before = sorted(teachers[0].cell.weight_parameters())
    GreedyTopK(teachers[0], K)
    assert sorted(teachers[0].cell.weight_parameters()) == before
    assert "model.embed_tokens.weight" in before


@pytest.mark.slow
def test_default_model_batched_turns_equal_single_sequence_greedy_and_full_topk():
    """The default SmolLM2 teacher, chat-templated text turns (one with a second turn on its own answer): B=4
    slots against B=1 greedy decoding, and the stored top-k against one B=1 forward of the whole sequence."""
    from tests.helpers import default_model_or_skip

    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.engine import greedy_generate
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    d = default_model_or_skip()
    tok = load_tokenizer(d)
    new = 40
    items = [EvalItem("a", "math", ("What is 17 times 23? Answer briefly.", "Now explain step 2 in more detail.")),
             EvalItem("b", "writing", ("Write a haiku about autumn leaves.",)),
             EvalItem("c", "coding", ("Write a Python function that reverses a string.",)),
             EvalItem("d", "stem", ("Explain photosynthesis in one sentence.",)),
             EvalItem("e", "roleplay", ("You are a pirate captain. Greet a group of new visitors.",))]
    batched = Teacher.load(d, RuntimeConfig(max_cache_len=256, batch_size=4, buckets=(1,), prefill_chunk=1))
    done = []
    BatchGreedyGenerator(batched, new, tok.eos_token_ids, K, tok).run(items, done.append)
    del batched
    single = Teacher.load(d, RuntimeConfig(max_cache_len=256, buckets=(1, 8, 16, 32, 64, 256), prefill_chunk=64))
    for f in sorted(done, key=lambda f: f.item.id):
        answers = []
        for k in range(f.item.num_turns):
            prompt = build_prompt(f.item, k, answers, tok, tok.eos_token_ids)
            ref = greedy_generate(single, prompt, new, tok.eos_token_ids)
            assert f.answers[k] == tuple(ref.tokens), (f.item.id, k, tok.decode(f.answers[k]), tok.decode(ref.tokens))
            answers.append(ref.tokens)
            seq, full = f.sequences[k], prompt + list(ref.tokens)
            n = len(full) - 1
            out = single.forward(ForwardInputs.for_tree(TreeLayout.chain(full[:n]), 0, 256, 256))
            logits = out.logits[0, f.starts[k]:]
            ref_vals = -np.sort(-logits, axis=-1)[:, :K]
            np.testing.assert_allclose(seq.topk_logits.astype(np.float32), ref_vals, rtol=5e-3, atol=2e-2)
            assert np.mean(seq.topk_ids[:, 0] == np.argmax(logits, -1)) == 1.0
    assert len(done) == len(items) and done[[f.item.id for f in done].index("a")].starts[1] > 0


class _FixedLogits:
    """A stand-in teacher Cell whose logits are given rows (``[B, T, V]``) and whose features are zeros."""

    @staticmethod
    def cell(logits: np.ndarray):
        import mindspore as ms
        from mindspore import Parameter, Tensor, nn, ops

        class Cell(nn.Cell):
            def __init__(self):
                super().__init__()
                self.logits = Parameter(Tensor(logits), name="logits")

            def construct(self, input_ids, positions, mask, cache_rows):
                return self.logits, ops.zeros((logits.shape[0], logits.shape[1], 6), ms.float32)

        return Cell()


@pytest.mark.parametrize("device", ["CPU", "Ascend"])
def test_data_greedy_token_is_numpys_argmax_on_literal_ties_on_either_devices_rule(device):
    """The data's greedy token must be the engine's (``np.argmax``: first of equal maxima) whichever argmax the
    device uses (``ops.Argmax`` on the CPU, ``first_argmax`` elsewhere; the latter runs here too), in graph mode."""
    import mindspore as ms

    from mindspore_eagle.train.topk_teacher import TopKTeacher

    inf = np.inf
    rows = np.array([[1, 3, 0, 3, 2, 3, 0, 1], [5] * 8, [0, 0, 0, 0, 0, 0, 7, 7], [-inf] * 7 + [-1],
                     [2, 1, 9, 0, 9, 0, 0, 0], [-4, -3, -3, -9, -3, -8, -5, -6]], np.float32)
    want = [1, 0, 6, 7, 2, 1]  # written out by hand
    wide = np.random.default_rng(0).integers(0, 3, (2, 49152)).astype(np.float32)  # ~16k-way ties per row
    wide[1, [40000, 49151]] = 9.0
    for logits, expect in ((rows[:, None, :], want), (wide[:, None, :], [int(np.argmax(wide[0])), 40000])):
        fn = ms.jit(TopKTeacher(_FixedLogits.cell(logits), 2, device))
        z = ms.Tensor(np.zeros((logits.shape[0], 1), np.int32))
        greedy, finite, ids, _, _ = fn(z, z, z, z)
        assert greedy.asnumpy()[:, 0].tolist() == expect == np.argmax(logits[:, 0], -1).tolist()
        assert finite.asnumpy()[:, 0].tolist() == np.isfinite(logits[:, 0]).all(-1).tolist()
        top = ids.asnumpy()[:, 0, 0]  # some maximum (TopK names no order among ties), whichever argmax rule
        assert np.array_equal(logits[np.arange(len(top)), 0, top], logits[:, 0].max(-1))


def test_a_step_whose_logits_hold_nan_or_inf_is_refused_as_data_error(hf_tiny):
    """A token chosen from NaN logits would be stored as if the teacher had said it: the step names the slot."""
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.errors import DataError
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.train.topk_teacher import GreedyTopK

    _, untied_dir, _ = hf_tiny("pangu")  # untied: a NaN embedding row reaches only the slot that feeds it
    teacher = Teacher.load(untied_dir, RuntimeConfig(max_cache_len=16, batch_size=2, buckets=(1,), prefill_chunk=1))
    step = GreedyTopK(teacher, 4)
    out = step.step(np.array([3, 4]), np.array([0, 0]))
    assert out.greedy.shape == (2,) and np.isfinite(out.topk_logits.astype(np.float32)).all()
    emb = teacher.cell.model.embed_tokens.weight
    table = emb.asnumpy()
    table[7] = np.nan
    emb.set_data(ms_tensor(table))
    with pytest.raises(DataError, match=r"NaN or inf in slots \[1\]"):
        step.step(np.array([3, 7]), np.array([1, 1]))


def ms_tensor(a):
    from mindspore import Tensor

    return Tensor(a)
