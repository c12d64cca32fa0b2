"""The bit-identity claims of tests/test_sharding.py (seeds sharded over 4 devices train as on 1)
again, with XLA's optimisations on: a child session of tests/test_optimised.py's kind, in a file of
its own so that pytest-xdist (--dist loadfile) runs it beside test_optimised.py's, not after it.
Which marked files it runs: test_optimised.RUNNERS."""
import os

import pytest

from tests.test_optimised import run_optimised


@pytest.mark.slow
def test_sharding_bit_identity_claims_hold_with_xla_optimisations_on(tmp_path):
  run_optimised(os.path.basename(__file__), tmp_path)
