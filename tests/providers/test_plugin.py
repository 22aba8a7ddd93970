"""Capabilities.common_to: what every deployment of a route accepts."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from llmgw.providers.plugin import Capabilities

capabilities = st.builds(
    Capabilities,
    **{name: st.booleans() for name in attrs.fields_dict(Capabilities)},
)


@given(st.lists(capabilities, min_size=1, max_size=4))
def test_a_capability_is_common_when_every_deployment_has_it(every: list[Capabilities]) -> None:
    common = Capabilities.common_to(every)

    for name in attrs.fields_dict(Capabilities):
        assert getattr(common, name) == all(getattr(c, name) for c in every)


def test_one_deployment_s_capabilities_are_its_own() -> None:
    own = Capabilities(reasoning=True, native_messages=True)

    assert Capabilities.common_to([own]) is own
