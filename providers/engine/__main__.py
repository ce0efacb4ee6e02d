"""`python -m decidealot.providers.engine`: the process a local provider's engine runs in."""

import os

# oneDNN (bf16 and int8 matrix products on CPU) keeps every primitive it built, and ideep its
# parameters, per input shape: up to 1024 each, a few MB apiece, so a bf16 worker serving
# passes of many lengths grew by hundreds of MB (docs/performance.md). A few dozen shapes'
# worth stays; rebuilding one costs milliseconds. Set before torch loads; an operator's own
# values win.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
os.environ.setdefault("LRU_CACHE_CAPACITY", "16")

from decidealot.providers.engine.proc import main

main()
