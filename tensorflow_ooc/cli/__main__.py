"""``python -m tensorflow_ooc.cli``: runs ``tfooc``."""

import sys

from . import main

sys.exit(main())
