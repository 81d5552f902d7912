"""Cost of refusing non-finite weights on load: ``Teacher.load`` of the default model with and without the check.

``checkpoint.checked_weight`` (dtype + finiteness, one pass per tensor) runs inside ``load_strict``; the
"unchecked" variant replaces it by the bare float32 cast that ran before. The two variants alternate
``--repeats`` times in one process so both see the same page cache and machine load; the median of each is
reported (and the minimum, the better estimate on a shared machine), and the check alone over tensors already in memory (the part that does not depend on I/O noise).
Last stdout line: one JSON object.

    python scripts/bench_weight_check.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

os.environ.setdefault("GLOG_v", "3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from mindspore_eagle import checkpoint
    from mindspore_eagle.assets import require_default_model
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.teacher import Teacher

    model_dir = require_default_model()
    checked = checkpoint.checked_weight

    def unchecked(source, name, arr):
        return np.asarray(arr, dtype=np.float32)

    runtime = RuntimeConfig(max_cache_len=64, buckets=(1,), prefill_chunk=1)
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    Teacher.load(model_dir, runtime)  # warm the page cache and MindSpore's first-use costs
    for _ in range(args.repeats):
        for variant, fn in (("checked", checked), ("unchecked", unchecked)):
            checkpoint.checked_weight = fn
            t = time.perf_counter()
            Teacher.load(model_dir, runtime)
            times[variant].append(time.perf_counter() - t)
    checkpoint.checked_weight = checked
    check_s = []  # the check alone, over every tensor of the file (already read, so no I/O in it)
    tensors = checkpoint.load_tensors(os.path.join(model_dir, checkpoint.CKPT_NAME))
    for _ in range(args.repeats):
        t = time.perf_counter()
        for name, arr in tensors.items():
            checked(model_dir, name, arr)
        check_s.append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:>9}: " + " ".join(f"{x:.3f}" for x in v) + f"  median {med[k]:.3f} s")
    print(json.dumps({"model": os.path.basename(model_dir), "repeats": args.repeats,
                      "load_s_checked": round(med["checked"], 3), "load_s_unchecked": round(med["unchecked"], 3),
                      "ratio": round(med["checked"] / med["unchecked"], 3),
                      "load_s_checked_min": round(min(times["checked"]), 3),
                      "load_s_unchecked_min": round(min(times["unchecked"]), 3),
                      "check_alone_s": round(statistics.median(check_s), 3),
                      "weights_mb": round(sum(a.nbytes for a in tensors.values()) / 1e6, 1)}))


if __name__ == "__main__":
    main()
