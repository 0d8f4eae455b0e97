"""pallas_kernels is a package of its own (the design card's layout): importing it, and
every kernel module in it, loads nothing of jaxvllm."""
from __future__ import annotations

import json
import subprocess
import sys


def test_pallas_kernels_import_alone():
    script = ("import json, sys, pallas_kernels, pallas_kernels.common, pallas_kernels.grouped_matmul_tpu, "
              "pallas_kernels.ragged_paged_attention_gpu, pallas_kernels.ragged_paged_attention_tpu; "
              "print(json.dumps([sorted(m for m in sys.modules if m.split('.')[0] == 'jaxvllm'), "
              "callable(pallas_kernels.ragged_paged_attention_tpu.ragged_paged_attention)]))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert json.loads(out.splitlines()[-1]) == [[], True]
