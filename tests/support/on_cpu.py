"""`python -m tests.support.on_cpu "FLAGS" ARGS...`: the `decidealot` command on a CPU whose
/proc/cpuinfo lists FLAGS (space-separated), so that a test runs what another kind of CPU
runs: a served int8 needs VNNI or AMX, refused before listening on a CPU without them (a Zen 3).
The worker's own choices read the real flags; only an explicit precision reaches it here."""

import os
import sys

from decidealot import cpu
from decidealot.cli import main

ZEN4 = "avx2 avx512f avx512_bf16 avx512_vnni"
"""An AMD Zen 4's units: bf16 and int8 dot products, no AMX."""

if __name__ == "__main__":
    listed = frozenset(sys.argv[1].split())
    cpu.flags = lambda: listed
    for name in [name for name in os.environ if name.startswith("DECIDEALOT_TEST_")]:
        del os.environ[name]  # the fakes' variables, which `decidealot` refuses as unknown
    sys.exit(main(sys.argv[2:]))
