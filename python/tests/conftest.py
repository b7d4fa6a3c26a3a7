"""The tests run against the library CLFFN_LIBRARY names (ctest sets it to the build's), or the
one the package was installed with."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
