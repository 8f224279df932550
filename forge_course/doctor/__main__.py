"""``python -m forge_course.doctor path/to/script.py:fit``."""

import sys

from forge_course.doctor.cli import main

sys.exit(main())
