#!/usr/bin/env python3
"""Checks `brink-operator crds` output offline, as far as no API server is needed.

usage: crd_check.py CRDS_YAML EXAMPLES_JSON

1. Each CRD is valid against Kubernetes 1.37's own CustomResourceDefinition schema
   (kubernetes-validate, strict: unknown fields are errors). A deliberately broken copy of each
   must fail, so a validator that accepts anything is noticed.
2. Each example custom resource ({"kind", "valid", "name", "object", "field"}) is checked
   against its CRD's openAPIV3Schema (OpenAPI 3.0 = JSON Schema draft 4 semantics, e.g. a
   boolean exclusiveMinimum): a valid example must pass; an invalid one must be rejected, and
   at its `field` (dotted path; a missing required field counts as an error at its own path),
   so that an example rejected for another reason does not count. CEL rules are not evaluated
   here (the Rust tests evaluate them).

Prints one line per check; exits 1 on the first kind of mismatch with what was expected.
"""
import copy
import json
import sys

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = "1.37.0"


def error_fields(errors):
    """The dotted paths the errors point at; a `required` error points at each missing field."""
    fields = set()
    for e in errors:
        path = ".".join(map(str, e.path))
        fields.add(path)
        if e.validator == "required" and isinstance(e.instance, dict):
            fields.update(f"{path}.{name}".lstrip(".") for name in e.validator_value if name not in e.instance)
    return fields


def main(crds_path, examples_path):
    with open(crds_path) as f:
        crds = [d for d in yaml.safe_load_all(f) if d]
    with open(examples_path) as f:
        examples = json.load(f)
    failures = []
    schemas = {}
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            kubernetes_validate.validate(crd, K8S_VERSION, True)
            print(f"ok   CRD {name} is a valid CustomResourceDefinition for Kubernetes {K8S_VERSION}")
        except kubernetes_validate.ValidationError as e:
            failures.append(f"CRD {name} is not a valid CustomResourceDefinition: {e.message} at {list(e.path)}")
        broken = copy.deepcopy(crd)
        broken["spec"]["versions"][0]["served"] = "yes"
        try:
            kubernetes_validate.validate(broken, K8S_VERSION, True)
            failures.append(f"negative control: CRD {name} with served: 'yes' passed kubernetes-validate")
        except kubernetes_validate.ValidationError:
            pass
        schemas[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for ex in examples:
        kind, valid, label = ex["kind"], ex["valid"], ex["name"]
        if kind not in schemas:
            failures.append(f"example {label}: no CRD of kind {kind}")
            continue
        errors = sorted(jsonschema.Draft4Validator(schemas[kind]).iter_errors(ex["object"]), key=lambda e: list(e.path))
        where = "; ".join(f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors)
        if valid and errors:
            failures.append(f"valid example {kind}/{label} rejected: {where}")
        elif not valid and not errors:
            failures.append(f"invalid example {kind}/{label} accepted by the schema")
        elif not valid and ex["field"] not in error_fields(errors):
            failures.append(f"invalid example {kind}/{label} rejected, but not at {ex['field']}: {where}")
        else:
            print(f"ok   {kind}/{label}: {'accepted' if valid else 'rejected (' + where + ')'}")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
