"""URLs are shown without userinfo or query values, wherever they reach a person or a client."""

from modelplex.wire.redact import redact_text, redact_url

#: A URL as configured → as every message shows it.
SHOWN = {
    "https://user:pa55@store.example/a/{model_id}.pt": "https://REDACTED@store.example/a/{model_id}.pt",
    "https://store.example/m.pt?sig=abc&expires=9": "https://store.example/m.pt?sig=REDACTED&expires=REDACTED",
    "https://u:p@h:8443/x?token=t#frag": "https://REDACTED@h:8443/x?token=REDACTED#frag",
    "https://h/x?opaque-token": "https://h/x?REDACTED",
    "https://h/plain/{model_id}.pt": "https://h/plain/{model_id}.pt",
    "s3://bucket/key/{model_id}": "s3://bucket/key/{model_id}",
    "file:models/{model_id}.pt": "file:models/{model_id}.pt",
}


def test_userinfo_and_query_values_are_redacted():
    assert {url: redact_url(url) for url in SHOWN} == SHOWN


def test_urls_inside_a_message_are_redacted_and_the_message_kept():
    message = "model 'm' not found at https://u:pa55@h/m.pt?sig=s3cr3t: HTTP 404. Also http://a:b@c/d."
    shown = redact_text(message)
    assert shown == ("model 'm' not found at https://REDACTED@h/m.pt?sig=REDACTED: HTTP 404. "
                     "Also http://REDACTED@c/d.")
    assert "pa55" not in shown and "s3cr3t" not in shown


def test_a_message_without_urls_is_unchanged():
    assert redact_text("loading model 'x' failed: ValueError('bad')") == "loading model 'x' failed: ValueError('bad')"
