from durable.faults import _parse


def test_parse__count_and_action():
    assert _parse("after_unit:3, before_complete,after_claim:2:stop") == {
        "after_unit": (3, "kill"),
        "before_complete": (1, "kill"),
        "after_claim": (2, "stop"),
    }


def test_parse__empty_switches_nothing_on():
    assert _parse("") == {}
