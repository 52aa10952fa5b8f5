"""An HTTP job's URL in a message is shown with its credentials masked (rules/urls.py mask), and nothing else."""

import pytest

from queueprocessor.rules.urls import mask


@pytest.mark.parametrize(
    "shown, masked",
    [
        ("GET https://u:pw@h/x?token=t1&day=1: refused", "GET https://***@h/x?token=***&day=1: refused"),
        ("https://ghp_abc@github.com/a", "https://***@github.com/a"),  # a token as the user name
        ("http://h/x?Access_Token=a%20b#top", "http://h/x?Access_Token=***#top"),
        (
            "http://h/x?client_secret=s&X-Amz-Signature=g&sig=1",
            "http://h/x?client_secret=***&X-Amz-Signature=***&sig=***",
        ),
        ("http://h/x?apikey=k;pwd=p&passwd=q", "http://h/x?apikey=***;pwd=***"),  # pwd= hides the rest, as before
        ("'http://h/x?key=k' answered", "'http://h/x?key=***' answered"),
        ("http://h/keys?monkey=1&keyring=2&day=3", "http://h/keys?monkey=1&keyring=2&day=3"),
        ("postgresql://qp:s3cret@db/farm", "postgresql://qp:***@db/farm"),  # a database's user is still shown
    ],
)
def test_credentials_in_an_http_url_are_masked(shown, masked):
    assert mask(shown) == masked
