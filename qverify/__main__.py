import sys

from qverify.cli import main

sys.exit(main())
