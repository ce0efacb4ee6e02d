"""`python -m decidealot.providers.worker`: the process a local provider's engine runs in."""

import sys

from decidealot.providers.worker.process import main

sys.exit(main())
