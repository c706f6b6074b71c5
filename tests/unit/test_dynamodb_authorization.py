"""The condition context the local stack gives DynamoDB's fine-grained condition keys."""

from __future__ import annotations

from relevo_local.moto.dynamodb_authorization import expression_attributes


def test_top_level_attribute_names_of_expressions():
    assert expression_attributes(
        "SET #status = :running, agent_id = :agent, reconciliations = "
        "list_append(if_not_exists(reconciliations, :none), :e) "
        "REMOVE exit_code, error_class",
        {"#status": "status"},
    ) == {"status", "agent_id", "reconciliations", "exit_code", "error_class"}
    assert expression_attributes(
        "attribute_exists(pk) AND (attribute_not_exists(attempt) OR attempt < :attempt OR (attempt = "
        ":attempt AND lease_expires_at < :epoch))",
        None,
    ) == {"pk", "attempt", "lease_expires_at"}
    # Nested paths count as their top-level attribute; values and functions are not attributes.
    assert expression_attributes("SET envelope.stages[0].command = :c, #n.x = :y", {"#n": "notes"}) == {
        "envelope",
        "notes",
    }
    assert expression_attributes("size(receipt) > :zero AND begins_with(sk, :prefix)", None) == {
        "receipt",
        "sk",
    }
    assert expression_attributes(None, None) == set()
