"""``python -m mlsl_tf.runner ...`` is mlslrun."""

import sys

from mlsl_tf.runner.launch import main

if __name__ == "__main__":
    sys.exit(main())
