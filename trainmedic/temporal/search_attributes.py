"""trainmedic's search attributes (docs/architecture.md "Contracts").

Registered by the dev server at start (`--search-attribute`) and, in production, by
the operator (`temporal operator search-attribute create`). An unregistered attribute
makes upserts fail in ways that look like a hung workflow, so the worker checks first.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

TM_CLUSTER = SearchAttributeKey.for_keyword("TmCluster")
TM_JOB = SearchAttributeKey.for_keyword("TmJob")
TM_NODES = SearchAttributeKey.for_keyword_list("TmNodes")
TM_CATEGORY = SearchAttributeKey.for_keyword("TmCategory")
TM_ACTION = SearchAttributeKey.for_keyword("TmAction")
TM_STAGE = SearchAttributeKey.for_keyword("TmStage")
TM_MODE = SearchAttributeKey.for_keyword("TmMode")
TM_OUTCOME = SearchAttributeKey.for_keyword("TmOutcome")

# Name -> type as the `temporal` CLI spells it.
REQUIRED: dict[str, str] = {
    "TmCluster": "Keyword",
    "TmJob": "Keyword",
    "TmNodes": "KeywordList",
    "TmCategory": "Keyword",
    "TmAction": "Keyword",
    "TmStage": "Keyword",
    "TmMode": "Keyword",
    "TmOutcome": "Keyword",
}
