"""Training an EAGLE-3 draft head for a teacher, in MindSpore.

Pipeline (each step resumable, each a module):

    prompts.py  the offline prompt set: nine categories of conversations, some with a second turn
                (word lists in prompt_words.py), deduplicated, never an evaluation turn
    batch_greedy.py  the teacher's own greedy answers, B slots refilled continuously (topk_teacher.py: greedy
                token, top-k and features computed in the graph)
    data.py     fp16 shards of per-token teacher features (aux hidden low|mid|high) and top-k teacher logits,
                the manifest, the resumable generation run and its CLI
    vocab.py    draft vocabulary: the N most frequent teacher output tokens -> d2t offsets, t2d mask
    ttt.py      the training forward and the training-time-test (TTT) objective
    trainer.py  AdamW + warm-up + clipping, checkpoints, resume, held-out acc_k / simulated tau;
                ``train_draft_main(argv)`` is the ``train-draft`` command
    export.py   the head in the public EAGLE-3 format (config.json + model.safetensors), atomically
    ledger.py   the answer ledger: a data directory's answers (~2 bytes per token, no prompt ids) in part files
                for git; rebuild.py: the shards rebuilt from them, bit for bit, by the teacher's prefill
    identity.py which teacher, data and recipe a data or run directory belongs to (identity.json): a rerun
                with another is refused instead of mixing the two
    train_config.py  DataConfig (data.py's settings) and TrainConfig (trainer.py's): a recipe file's two sections
                (configs/train/*.json), one flag per field

Terms. *Position* p: index into one training sequence (prompt + teacher answer). *Entry* i: the draft's
input pair (token at p = i + 1, teacher features at p = i) -- EAGLE's shift, the same as
``mindspore_eagle.draft.proposer``. *Step* k (0..K-1): the TTT unroll; step 0 reads teacher features, step
k >= 1 reads the head's own step k-1 output and predicts k positions further ahead.
"""
