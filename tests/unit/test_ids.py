"""Model ids that could escape a model source are refused before anything is read."""

import pytest

from modelplex.ids import InvalidModelId, validate_model_id


@pytest.mark.parametrize("model_id", ["model-01", "user_42", "llama.v2", "A", "0"])
def test_ordinary_ids_pass(model_id):
    assert validate_model_id(model_id) == model_id


@pytest.mark.parametrize(
    "model_id",
    [
        "", "..", "../etc/passwd", "a/../b", "a/b", "/etc/passwd", "..\\windows", "C:\\x",
        "%2e%2e", "%2F", "a?b=c", "a#frag", "user@host", "http://evil", "a b", "tab\there",
        "new\nline", "nul\x00", ".hidden", "-rf", "a..b", "é", "x" * 201,
    ],
)
def test_ids_that_could_escape_the_source_are_refused(model_id):
    with pytest.raises(InvalidModelId):
        validate_model_id(model_id)


def test_trailing_newline_is_refused():
    # `$` in a regex would let "abc\n" through; the check must not.
    with pytest.raises(InvalidModelId):
        validate_model_id("abc\n")
