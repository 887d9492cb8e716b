"""The light tokenizer equals AutoTokenizer on the real models' directories (those pulled)."""

import pytest

from specdec.light_tokenizer import LightTokenizer
from specdec.paths import cache_root

from tokenizer_checks import assert_same

pytestmark = pytest.mark.slow

DIRS = sorted((cache_root() / "models").glob("*/bf16"))


@pytest.mark.skipif(not DIRS, reason="no real model pulled")
@pytest.mark.parametrize("path", DIRS, ids=[d.parent.name for d in DIRS])
def test_light_tokenizer_equals_autotokenizer_on_real_models(path):
    light, hf = assert_same(path)
    assert isinstance(light, LightTokenizer)
    code = (
        'def merge(a: list[int], b: list[int]) -> list[int]:\n    """Merge — «sorted» lists."""\n'
    )
    assert light(code * 20)["input_ids"] == hf(code * 20)["input_ids"]
