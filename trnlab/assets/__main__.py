import sys

from trnlab.assets.build import main

sys.exit(main())
