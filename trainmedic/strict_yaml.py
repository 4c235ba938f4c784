"""A YAML loader that refuses a key given twice in one mapping.

PyYAML keeps the last of two equal keys without a word. In a policy that silently turns
`mode: {default: monitor, ..., default: auto}` into autonomy, and in the catalog it once
hid a rule's first `non_examples:` list behind a second. Both loaders use this one.
"""

from __future__ import annotations

from typing import Any

import yaml


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader (no Python objects), refusing repeated mapping keys."""


def _mapping_without_repeats(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"key {key!r} given twice",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node)


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats
)
