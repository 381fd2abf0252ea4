"""Checks poolshim's exit statistics (POOLSHIM_STATS=json) against conditions.

Usage: check_stats.py STATS.json CONDITION...
A condition is PATH OP NUMBER with PATH a dotted key inside a device's object
(e.g. doors.driver>0, calls.cudaMalloc>=10), summed over the devices, or a
top-level key when no device has it (invalid_frees, passthrough, rank). OP is one of >= <= == != > <.
PATH may start with deviceN. to read the entry of device N alone
(device1.bytes.reserved_peak<=67108864; a device the report does not list
fails every condition on it); a word instead of NUMBER compares a string with
== or != (device1.stack==serve_cap). Alternatives joined by
'|' pass when any holds (calls.cudaMalloc>0|calls.cuMemAlloc>0). A condition
starting with '?' is only printed (information, never a failure).
Prints each condition with its value; exits 0 when all hold, 1 otherwise,
2 when the file is missing or not poolshim's JSON (the shim did not run).
"""
import json
import operator
import re
import sys

OPERATORS = {">=": operator.ge, "<=": operator.le, "==": operator.eq,
             "!=": operator.ne, ">": operator.gt, "<": operator.lt}
CONDITION = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?|[A-Za-z_][\w.-]*)\s*$")
ONE_DEVICE = re.compile(r"^device(\d+)\.(.+)$")


def load(path):
    """The statistics object; the file may hold other lines, take the last JSON one."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    candidates = [line for line in text.splitlines() if line.strip().startswith("{")]
    candidates.append(text)
    for candidate in reversed(candidates):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict) and "devices" in data:
            return data
    raise ValueError("no poolshim statistics object in the file")


def lookup(node, path, kinds=(int, float)):
    """The value (of one of kinds) at a dotted path inside node, or None when it is not there."""
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, kinds) and not isinstance(node, bool) else None


def value_of(data, path, kinds=(int, float)):
    """deviceN.PATH: that device's value, None when the device or key is absent.
    Else numbers are summed over the devices that have the key; else the
    top-level value (passthrough and invalid_frees are process-wide); else 0."""
    one = ONE_DEVICE.match(path)
    if one:
        wanted = int(one.group(1))
        for device in data.get("devices", []):
            if device.get("device") == wanted:
                return lookup(device, one.group(2), kinds)
        return None
    if kinds == (str,):
        found = [v for v in (lookup(device, path, kinds) for device in data.get("devices", [])) if v is not None]
        return found[0] if len(found) == 1 else lookup(data, path, kinds)
    values = [v for v in (lookup(device, path) for device in data.get("devices", [])) if v is not None]
    if values:
        return sum(values)
    top = lookup(data, path)
    return top if top is not None else 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    try:
        data = load(argv[1])
    except (OSError, ValueError) as error:
        print(f"stats: cannot read {argv[1]}: {error} (was the shim loaded?)")
        return 2
    all_hold = True
    for condition in argv[2:]:
        informative = condition.startswith("?")
        condition = condition.lstrip("?")
        holds_any = False
        shown = []
        for alternative in condition.split("|"):
            match = CONDITION.match(alternative)
            if not match:
                print(f"stats: bad condition {alternative!r}")
                return 2
            path, op, expected = match.groups()
            if re.match(r"^-?\d", expected):
                value = value_of(data, path)
                holds = value is not None and OPERATORS[op](value, float(expected))
            elif op in ("==", "!="):
                value = value_of(data, path, (str,))
                holds = value is not None and OPERATORS[op](value, expected)
            else:
                print(f"stats: bad condition {alternative!r} (a word compares with == or != only)")
                return 2
            holds_any = holds_any or holds
            shown.append(f"{path}={value if value is not None else 'absent'}")
        verdict = "info" if informative else ("ok" if holds_any else "FAIL")
        print(f"stats: {condition}: {', '.join(shown)}: {verdict}")
        all_hold = all_hold and (holds_any or informative)
    return 0 if all_hold else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
