"""PlanRequest checks the Job field constraints once (the search builds its jobs with ``Job.model_construct``)."""

import pytest

from moetune.catalog.models import get_model
from moetune.catalog.systems import get_system
from moetune.errors import InputError
from moetune.plan.search import PlanRequest


@pytest.mark.parametrize("field,value", [("gpus", 0), ("global_batch_size", -1), ("seq_length", 0),
                                         ("gpus", 8.0), ("gpus", True), ("mbs_options", (1, 0))])
def test_non_positive_or_non_integer_values_are_refused(field, value):
    kw = dict(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=16, global_batch_size=1024,
              seq_length=4096)
    kw[field] = value
    with pytest.raises(InputError) as e:
        PlanRequest(**kw)
    assert e.value.field == field and "expected a positive integer" in str(e.value)


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    req = PlanRequest(model=get_model("Qwen3-30B-A3B"), system=get_system("DGX-H100"), gpus=np.int64(16),
                      global_batch_size=1024, seq_length=4096)
    assert req.gpus == 16
