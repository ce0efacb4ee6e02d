import sys

from decidealot.cli import main

sys.exit(main())
