"""The ddblease guard for a sink written in Python (boto3).

The same DynamoDB requests as the Go Guard (docs/guard.md, "From other
languages"), so that a Go writer and this one agree on one item's fence
high-water mark:

    check_fence             Guard.Check: a consistent read of the lease item
    guarded_put             Guard.Put: the item keeps its fence high-water mark
    guarded_update          Guard.Update: the same, for an UpdateItem
    guarded_transact_write  Guard.TransactWrite: a ConditionCheck on the lease
                            item's fence, and the mark on every item written

Every function fails closed: any error rejects the write. Items and values
are in DynamoDB's JSON form ({"S": "x"}, {"N": "1"}), as the low-level
client takes them.
"""

import random
import re
import secrets
import time

from botocore.exceptions import ClientError

LEASE_FENCE_ATTRIBUTE = "fence"  # the lease item's current fence
FENCE_ATTRIBUTE = "fence"  # default of the item's mark (Go: DefaultGuardFenceAttribute)
TOKEN_ATTRIBUTE = "fenceWrite"  # default of the write token (Go: DefaultGuardTokenAttribute)

# The guard's placeholders; the caller's expressions must not use any
# placeholder starting with #ddblease or :ddblease.
FENCE_NAME, FENCE_VALUE = "#ddbleaseFence", ":ddbleaseFence"
TOKEN_NAME, TOKEN_VALUE = "#ddbleaseToken", ":ddbleaseToken"


class Layout:
    """Where the Go library keeps its items in the lease table (Go:
    ddblease.Layout): the names of the table's partition and sort keys and
    the prefix of the library's partition keys. Every writer of a job must
    use the replicas' layout."""

    def __init__(self, partition_key="pk", sort_key="sk", prefix=""):
        if not partition_key or not sort_key or partition_key == sort_key:
            raise ValueError("Layout: partition_key and sort_key must be set and differ")
        self.partition_key, self.sort_key, self.prefix = partition_key, sort_key, prefix

    def lease_key(self, job):
        """The key of a job's lease item: partition <prefix>job#<job>, sort key "lease"."""
        return {self.partition_key: {"S": self.prefix + "job#" + job}, self.sort_key: {"S": "lease"}}


DEFAULT_LAYOUT = Layout()


def lease_key(job, layout=DEFAULT_LAYOUT):
    """The key of a job's lease item in layout (the default: pk, sk, no prefix)."""
    return layout.lease_key(job)


class StaleFenceError(Exception):
    """A write or check refused because a newer fence exists.

    current is the job's current fence (0: no lease item) or the item's mark.
    """

    def __init__(self, fence, current):
        self.fence, self.current = fence, current
        if current == 0:
            msg = "stale fence: fence %d refused: the job has no lease" % fence
        else:
            msg = "stale fence: fence %d refused: the current fence is %d" % (fence, current)
        super().__init__(msg)


def check_fence(client, table, job, fence, layout=DEFAULT_LAYOUT):
    """Returns only if the job's lease item holds exactly fence.

    A consistent read, not atomic with what follows: for sinks outside
    DynamoDB.
    """
    item = client.get_item(TableName=table, Key=lease_key(job, layout), ConsistentRead=True).get("Item")
    current = _number(item, LEASE_FENCE_ATTRIBUTE) if item else 0
    if current != fence:
        raise StaleFenceError(fence, current)


def guarded_put(client, fence, fence_attribute=FENCE_ATTRIBUTE, token_attribute=TOKEN_ATTRIBUTE, **put):
    """put_item(**put), setting the item's mark to fence and a write token.

    On condition that the stored item has no mark or one not above fence,
    does not carry this write's token, and put's own ConditionExpression
    holds. A fence lower than the highest that wrote this item raises
    StaleFenceError.
    """
    m = _Marker(fence_attribute, token_attribute)
    tok = secrets.token_hex(16)
    try:
        client.put_item(**_supported(client, "PutItem", m.put(dict(put), fence, tok)))
    except ClientError as err:
        m.explain(err, fence, tok, lambda: _read(client, put["TableName"], _key_of(client, put["TableName"], put["Item"])))


def guarded_update(client, fence, fence_attribute=FENCE_ATTRIBUTE, token_attribute=TOKEN_ATTRIBUTE, **update):
    """update_item(**update) with the mark's assignments added to its SET clause.

    On the conditions of guarded_put. Its UpdateExpression must not refer
    to the mark's or the token's attribute.
    """
    m = _Marker(fence_attribute, token_attribute)
    tok = secrets.token_hex(16)
    try:
        client.update_item(**_supported(client, "UpdateItem", m.update(dict(update), fence, tok)))
    except ClientError as err:
        m.explain(err, fence, tok, lambda: _read(client, update["TableName"], update["Key"]))


def guarded_transact_write(client, table, job, fence, items, fence_attribute=FENCE_ATTRIBUTE, token_attribute=TOKEN_ATTRIBUTE,
                           layout=DEFAULT_LAYOUT):
    """transact_write_items(items) with a ConditionCheck on the lease item's fence.

    Any fence but the job's current one raises StaleFenceError, and nothing
    is written. Every Put and Update among items sets the mark as
    guarded_put does and every Delete is on the mark's condition, so that
    forms mixed on one item agree. A conflict with another write
    (TransactionConflict) is retried for up to five seconds under the same
    ClientRequestToken.
    """
    if not 1 <= len(items) <= 99:
        raise ValueError("guarded_transact_write: %d items; between 1 and 99 are allowed" % len(items))
    m = _Marker(fence_attribute, token_attribute)
    tok = secrets.token_hex(16)
    check = {"ConditionCheck": {
        "TableName": table,
        "Key": lease_key(job, layout),
        "ConditionExpression": "#fence = :fence",
        "ExpressionAttributeNames": {"#fence": LEASE_FENCE_ATTRIBUTE},
        "ExpressionAttributeValues": {":fence": {"N": str(fence)}},
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }}
    request = [check] + [m.action(it, fence, tok) for it in items]
    deadline, wait = time.monotonic() + 5, 0.02
    while True:
        try:
            client.transact_write_items(TransactItems=request, ClientRequestToken=tok)
            return
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = err.response.get("CancellationReasons") or []
            codes = [r.get("Code") for r in reasons]
            if "TransactionConflict" in codes and set(codes) <= {"None", "TransactionConflict"} and time.monotonic() + wait < deadline:
                time.sleep(wait * (0.5 + random.random()))
                wait = min(2 * wait, 0.32)
                continue
            if codes and codes[0] == "ConditionalCheckFailed":
                lease = reasons[0].get("Item") or _read(client, table, lease_key(job, layout))
                raise StaleFenceError(fence, _number(lease, LEASE_FENCE_ATTRIBUTE) if lease else 0) from err
            for i, it in enumerate(items):
                r = reasons[i + 1] if i + 1 < len(reasons) else {}
                if r.get("Code") != "ConditionalCheckFailed" or "ConditionCheck" in it:
                    continue
                stored = r.get("Item") or _read_action(client, it)
                if m.carries(stored, tok):
                    return  # an earlier attempt landed: its answer was lost
                mark = m.mark_of(stored)
                if mark > fence:
                    raise StaleFenceError(fence, mark) from err
            raise  # a condition of the caller's failed


class _Marker:
    def __init__(self, fence_attribute, token_attribute):
        if fence_attribute == token_attribute:
            raise ValueError("fence and token attributes are both %r" % fence_attribute)
        self.fence_attr, self.token_attr = fence_attribute, token_attribute

    def condition(self, req, fence, tok):
        """ANDs the mark's condition (and, with tok, the token's) with the caller's."""
        names = dict(req.get("ExpressionAttributeNames") or {})
        values = dict(req.get("ExpressionAttributeValues") or {})
        for k in list(names) + list(values):
            if _reserved(k):
                raise ValueError("the placeholder %s is reserved for the guard" % k)
        own = (req.get("ConditionExpression") or "").strip()
        if _reserved(own):
            raise ValueError("the ConditionExpression uses a placeholder reserved for the guard")
        _check_parentheses(own)
        names[FENCE_NAME], values[FENCE_VALUE] = self.fence_attr, {"N": str(fence)}
        cond = "(attribute_not_exists(%s) OR %s <= %s)" % (FENCE_NAME, FENCE_NAME, FENCE_VALUE)
        if tok is not None:
            names[TOKEN_NAME], values[TOKEN_VALUE] = self.token_attr, {"S": tok}
            cond += " AND (attribute_not_exists(%s) OR %s <> %s)" % (TOKEN_NAME, TOKEN_NAME, TOKEN_VALUE)
        if own:
            cond += " AND (%s)" % own
        req.update(ConditionExpression=cond, ExpressionAttributeNames=names, ExpressionAttributeValues=values,
                   ReturnValuesOnConditionCheckFailure="ALL_OLD")
        return req

    def put(self, req, fence, tok):
        item = dict(req["Item"])
        if self.token_attr in item:
            raise ValueError("the item holds attribute %r, which the guard keeps" % self.token_attr)
        item[self.fence_attr], item[self.token_attr] = {"N": str(fence)}, {"S": tok}
        req["Item"] = item
        return self.condition(req, fence, tok)

    def update(self, req, fence, tok):
        expr = req.get("UpdateExpression") or ""
        if _reserved(expr):
            raise ValueError("the UpdateExpression uses a placeholder reserved for the guard")
        # Conservative: refuses any mention of the mark's attributes, nested
        # paths included; the Go guard refuses only top-level ones.
        for a in (self.fence_attr, self.token_attr):
            refs = [a] + [k for k, v in (req.get("ExpressionAttributeNames") or {}).items() if v == a]
            if any(_mentions(expr, r) for r in refs):
                raise ValueError("the UpdateExpression refers to attribute %r, which the guard keeps" % a)
        req["UpdateExpression"] = _with_fence_set(expr)
        return self.condition(req, fence, tok)

    def action(self, it, fence, tok):
        if "Put" in it:
            return {"Put": self.put(dict(it["Put"]), fence, tok)}
        if "Update" in it:
            return {"Update": self.update(dict(it["Update"]), fence, tok)}
        if "Delete" in it:
            return {"Delete": self.condition(dict(it["Delete"]), fence, None)}
        return it

    def mark_of(self, item):
        return _number(item, self.fence_attr) if item and self.fence_attr in item else 0

    def carries(self, item, tok):
        return bool(item) and item.get(self.token_attr, {}).get("S") == tok

    def explain(self, err, fence, tok, read_item):
        """Turns a failed guarded write into applied, StaleFenceError or err."""
        if err.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise err  # the Go guard also reads the item back when no answer came
        stored = err.response.get("Item") or read_item()
        if self.carries(stored, tok):
            return  # an SDK retry of a write that landed
        mark = self.mark_of(stored)
        if mark > fence:
            raise StaleFenceError(fence, mark) from err
        raise err


def _supported(client, operation, req):
    """Drops ReturnValuesOnConditionCheckFailure where botocore does not know it
    for the operation (older botocore, such as Debian's, has it for
    transactions only): the stored item is then read back."""
    members = client.meta.service_model.operation_model(operation).input_shape.members
    if "ReturnValuesOnConditionCheckFailure" not in members:
        req.pop("ReturnValuesOnConditionCheckFailure", None)
    return req


def _with_fence_set(expr):
    assign = "%s = %s, %s = %s" % (FENCE_NAME, FENCE_VALUE, TOKEN_NAME, TOKEN_VALUE)
    if not expr.strip():
        return "SET " + assign
    m = re.search(r"(?<![A-Za-z0-9_#:.])SET(?![A-Za-z0-9_.])", expr, re.IGNORECASE)
    if m:
        return expr[:m.start() + 3] + " " + assign + "," + expr[m.start() + 3:]
    return "SET " + assign + " " + expr


def _mentions(expr, name):
    return re.search(r"(?<![A-Za-z0-9_#:])" + re.escape(name) + r"(?![A-Za-z0-9_])", expr) is not None


def _reserved(s):
    s = s.lower()
    return "#ddblease" in s or ":ddblease" in s


def _check_parentheses(cond):
    depth = 0
    for c in cond:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            raise ValueError("condition %r closes a parenthesis it did not open" % cond)
    if depth:
        raise ValueError("condition %r leaves a parenthesis open" % cond)


def _number(item, attr):
    try:
        return int(item[attr]["N"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("malformed item: attribute %r is not an integer" % attr) from None


def _read(client, table, key):
    return client.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")


def _read_action(client, it):
    if "Put" in it:
        p = it["Put"]
        return _read(client, p["TableName"], _key_of(client, p["TableName"], p["Item"]))
    for kind in ("Update", "Delete"):
        if kind in it:
            return _read(client, it[kind]["TableName"], it[kind]["Key"])
    return None


def _key_of(client, table, item):
    schema = client.describe_table(TableName=table)["Table"]["KeySchema"]
    return {k["AttributeName"]: item[k["AttributeName"]] for k in schema}
