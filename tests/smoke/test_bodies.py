"""A body that is not JSON becomes a few words in a diagnosis, never the page itself."""

from __future__ import annotations

from deploykit.profile.schema import SmokeCase
from deploykit.smoke import Exchange, judge, smoke_requests
from deploykit.smoke.bodies import describe_body, excerpt, is_markup

NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
    "</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)


def test_a_page_is_described_by_its_title_and_type() -> None:
    assert (
        describe_body(NGINX_502, "text/html; charset=utf-8")
        == "an HTML page titled '502 Bad Gateway' (text/html)"
    )
    assert describe_body("<!DOCTYPE html><p>hi</p>") == "an HTML page"
    assert describe_body("  \n") == "an empty body"
    assert describe_body("plain words", "text/plain") == "11 bytes of text/plain, not JSON"
    assert is_markup(NGINX_502) and is_markup("<?xml version='1.0'?><a/>") and not is_markup("a < b")


def test_an_excerpt_is_one_line_and_never_a_page() -> None:
    assert excerpt(NGINX_502, 300) == "an HTML page titled '502 Bad Gateway'"
    assert excerpt("Bad\n  Gateway\n", 300) == "Bad Gateway"
    assert excerpt("x" * 500, 300) == "x" * 300


def test_a_proxy_error_page_in_a_diagnosis_is_its_title() -> None:
    request = smoke_requests([SmokeCase(kind="completion")], "m")[0]
    result = judge(request, Exchange(status_code=502, body=None, raw_text=NGINX_502))
    assert result.miss and result.diagnosis == "HTTP 502: an HTML page titled '502 Bad Gateway'"
    page = judge(request, Exchange(status_code=200, body=None, raw_text=NGINX_502))
    assert not page.passed and "<" not in page.diagnosis and "502 Bad Gateway" in page.diagnosis
