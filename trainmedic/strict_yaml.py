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


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _mapping_without_repeats(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # "<<: *defaults" merges another mapping; construct_mapping does it
        key = loader.construct_object(key_node)
        try:
            repeated = key in seen
        except TypeError:  # a list or a mapping as a key: PyYAML's own error, with a line
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                "found an unhashable key",
                key_node.start_mark,
            ) from None
        if repeated:
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
