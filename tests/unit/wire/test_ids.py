"""Model ids: any printable string names a model; a source sees it escaped, never able to escape."""

import posixpath
from urllib.parse import unquote, urlsplit

import pytest

from modelplex.wire.ids import MAX_MODEL_ID_LENGTH, InvalidModelId, source_key, validate_model_id

TRICKY = [
    "..", ".", "../etc/passwd", "a/../b", "/etc/passwd", "a//b", "a/", "..\\windows", "C:\\x", "%2e%2e",
    "%2F", "a?b=c", "a#frag", "http://evil.example/x", "a b", "é/ü", "org/./name", "~root", "a/..",
]


@pytest.mark.parametrize(
    "model_id",
    ["model-01", "user_42", "llama.v2", "A", "0", "meta-llama/Llama-2-7b-hf", "model:v2", "user@tenant",
     ".hidden", "-rf", "a..b", "é", "x" * MAX_MODEL_ID_LENGTH, *TRICKY],
)
def test_printable_ids_are_accepted_as_ray_accepts_them(model_id):
    assert validate_model_id(model_id) == model_id


@pytest.mark.parametrize(
    "model_id",
    ["", "tab\there", "new\nline", "abc\n", "nul\x00", "del\x7f", "bidi\u202etxt", "zero\u200bwidth",
     "line\u2028sep", " padded", "padded ", "x" * (MAX_MODEL_ID_LENGTH + 1), b"bytes", None, 7],
)
def test_ids_no_source_can_use_are_refused(model_id):
    with pytest.raises(InvalidModelId):
        validate_model_id(model_id)


@pytest.mark.parametrize(
    ("model_id", "key"),
    [
        ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
        ("model:v2", "model:v2"),
        ("user@tenant", "user@tenant"),
        ("a b?c#d%", "a%20b%3Fc%23d%25"),
        ("../etc/passwd", "..%2Fetc%2Fpasswd"),
        ("/etc/passwd", "%2Fetc%2Fpasswd"),
        ("..", "%2E%2E"),
    ],
)
def test_source_keys_keep_folders_and_escape_the_rest(model_id, key):
    assert source_key(model_id) == key


@pytest.mark.parametrize("model_id", TRICKY)
def test_no_source_key_leaves_its_folder_or_changes_the_url(model_id):
    key = source_key(model_id)
    assert not key.startswith("/")
    assert ".." not in key.split("/") and "." not in key.split("/") and "" not in key.split("/")
    joined = posixpath.normpath(posixpath.join("/models", key))
    assert joined.startswith("/models/")
    url = urlsplit(f"https://store.example/models/{key}.pt")
    assert (url.netloc, url.query, url.fragment) == ("store.example", "", "")
    assert posixpath.normpath(url.path).startswith("/models/")
    assert unquote(key) == model_id  # reversible: two ids never share a key


def test_different_ids_get_different_keys():
    keys = {source_key(model_id) for model_id in TRICKY}
    assert len(keys) == len(TRICKY)
