import sys

from fedvlp.cli import main

sys.exit(main())
