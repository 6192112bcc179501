"""Runs the guard against a DynamoDB-compatible server with transactions.

The lease item and some guarded items are written by the Go library
(internal/cmd/ddbserve): a current fence is accepted, a stale one refused,
by every form, and the Go guard and this one agree on one item's mark.

    DDBLEASE_TEST_ENDPOINT=http://127.0.0.1:8000 DDBSERVE=/path/to/ddbserve \\
        /usr/bin/python3 -m unittest -v test_ddblease_guard

examples/other-languages-check sets both.
"""

import os
import secrets
import subprocess
import unittest

import boto3
from botocore.exceptions import ClientError

from ddblease_guard import (Layout, StaleFenceError, check_fence, guarded_put, guarded_transact_write,
                            guarded_update)

ENDPOINT = os.environ.get("DDBLEASE_TEST_ENDPOINT")
DDBSERVE = os.environ.get("DDBSERVE")
JOB = "billing"


def key(pk, layout=Layout()):
    """The key of an item of the test's own in the lease table (sort key "item", as ddbserve put writes it)."""
    return {layout.partition_key: {"S": pk}, layout.sort_key: {"S": "item"}}


def put(table, pk, v, layout=Layout()):
    return {"TableName": table, "Item": dict(key(pk, layout), v={"S": v})}


def update(table, pk, v, layout=Layout()):
    return {"TableName": table, "Key": key(pk, layout), "UpdateExpression": "SET v = :v",
            "ExpressionAttributeValues": {":v": {"S": v}}}


class GuardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not ENDPOINT or not DDBSERVE:
            raise RuntimeError("set DDBLEASE_TEST_ENDPOINT (a server with transactions) and DDBSERVE "
                               "(the built internal/cmd/ddbserve); examples/other-languages-check does")
        cls.client = boto3.client("dynamodb", endpoint_url=ENDPOINT, region_name="us-east-1",
                                  aws_access_key_id="test", aws_secret_access_key="test")
        cls.table = "py-guard-" + secrets.token_hex(4)
        assert cls.acquire() == 1
        assert cls.acquire() == 2  # fence 1 is stale from now on

    @classmethod
    def tearDownClass(cls):
        cls.client.delete_table(TableName=cls.table)

    @classmethod
    def acquire(cls):
        """Takes the job's lease through the Go library: a new fence."""
        out = subprocess.run([DDBSERVE, "acquire", "-endpoint", ENDPOINT, "-table", cls.table, "-job", JOB],
                             check=True, capture_output=True, text=True)
        return int(out.stdout.strip())

    def go_put(self, job, fence, pk, v):
        """Writes {pk, v} with the Go guard's Put; returns its exit status and stderr."""
        r = subprocess.run([DDBSERVE, "put", "-endpoint", ENDPOINT, "-table", self.table, "-job", job,
                            "-fence", str(fence), "-pk", pk, "-v", v], capture_output=True, text=True)
        return r.returncode, r.stderr

    def get(self, pk):
        return self.client.get_item(TableName=self.table, Key=key(pk), ConsistentRead=True).get("Item")

    def assert_stale(self, fn, fence, current):
        with self.assertRaises(StaleFenceError) as cm:
            fn()
        self.assertEqual((cm.exception.fence, cm.exception.current), (fence, current))

    def test_check_fence(self):
        check_fence(self.client, self.table, JOB, 2)
        self.assert_stale(lambda: check_fence(self.client, self.table, JOB, 1), 1, 2)
        self.assert_stale(lambda: check_fence(self.client, self.table, "no-such-job", 1), 1, 0)

    def test_guarded_put(self):
        guarded_put(self.client, 2, **put(self.table, "py#put", "newer"))
        item = self.get("py#put")
        self.assertEqual(item["fence"], {"N": "2"})
        self.assertIn("S", item["fenceWrite"], "the write token is stored")
        self.assert_stale(lambda: guarded_put(self.client, 1, **put(self.table, "py#put", "stale")), 1, 2)
        self.assertEqual(self.get("py#put")["v"], {"S": "newer"})
        # The caller's own condition failing is not a stale fence.
        with self.assertRaises(ClientError):
            guarded_put(self.client, 2, ConditionExpression="attribute_not_exists(pk)", **put(self.table, "py#put", "again"))

    def test_guarded_update(self):
        guarded_update(self.client, 2, **update(self.table, "py#update", "newer"))
        self.assertEqual(self.get("py#update")["fence"], {"N": "2"})
        self.assert_stale(lambda: guarded_update(self.client, 1, **update(self.table, "py#update", "stale")), 1, 2)
        self.assert_stale(lambda: guarded_put(self.client, 1, **put(self.table, "py#update", "stale")), 1, 2)
        self.assertEqual(self.get("py#update")["v"], {"S": "newer"})

    def test_guarded_transact_write(self):
        guarded_transact_write(self.client, self.table, JOB, 2, [
            {"Put": put(self.table, "py#txn", "newer")}, {"Update": update(self.table, "py#txn2", "newer")}])
        self.assertEqual(self.get("py#txn")["fence"], {"N": "2"})
        self.assertEqual(self.get("py#txn2")["fence"], {"N": "2"})
        self.assert_stale(lambda: guarded_transact_write(self.client, self.table, JOB, 1, [
            {"Put": put(self.table, "py#txn-stale", "stale")}]), 1, 2)
        self.assertIsNone(self.get("py#txn-stale"), "nothing is written")
        # A stale Put of an item the transaction wrote is refused by its mark.
        self.assert_stale(lambda: guarded_put(self.client, 1, **put(self.table, "py#txn", "stale")), 1, 2)
        # The caller's own condition failing comes back as the SDK's error.
        with self.assertRaises(ClientError) as cm:
            guarded_transact_write(self.client, self.table, JOB, 2, [
                {"Put": dict(put(self.table, "py#txn", "x"), ConditionExpression="attribute_not_exists(pk)")}])
        self.assertEqual(cm.exception.response["Error"]["Code"], "TransactionCanceledException")

    def test_mark_written_by_go(self):
        status, err = self.go_put(JOB, 2, "go#1", "go")
        self.assertEqual(status, 0, err)
        self.assertEqual(self.get("go#1")["fence"], {"N": "2"})
        self.assert_stale(lambda: guarded_put(self.client, 1, **put(self.table, "go#1", "stale")), 1, 2)
        self.assert_stale(lambda: guarded_update(self.client, 1, **update(self.table, "go#1", "stale")), 1, 2)
        self.assertEqual(self.get("go#1")["v"], {"S": "go"})
        # A mark above this job's current fence (another job's guard wrote
        # the item with fence 3) refuses a transaction too.
        status, err = self.go_put("ledger", 3, "go#shared", "ledger")
        self.assertEqual(status, 0, err)
        self.assert_stale(lambda: guarded_transact_write(self.client, self.table, JOB, 2, [
            {"Put": put(self.table, "go#shared", "billing")}]), 2, 3)
        self.assert_stale(lambda: guarded_transact_write(self.client, self.table, JOB, 2, [
            {"Delete": {"TableName": self.table, "Key": key("go#shared")}}]), 2, 3)
        self.assertEqual(self.get("go#shared")["v"], {"S": "ledger"})

    def test_mark_read_by_go(self):
        guarded_put(self.client, 2, **put(self.table, "py#for-go", "py"))
        status, err = self.go_put(JOB, 1, "py#for-go", "stale")
        self.assertEqual(status, 3, "the Go guard refuses fence 1: " + err)
        self.assertIn("stale fence", err)
        self.assertEqual(self.get("py#for-go")["v"], {"S": "py"})
        status, err = self.go_put(JOB, 2, "py#for-go", "go")
        self.assertEqual(status, 0, "the current fence is accepted: " + err)


class LayoutTest(unittest.TestCase):
    """A lease table of a single-table design: keys PK and SK, the library's keys prefixed."""

    LAYOUT = Layout(partition_key="PK", sort_key="SK", prefix="ddblease#")
    FLAGS = ["-partition-key", "PK", "-sort-key", "SK", "-prefix", "ddblease#"]

    @classmethod
    def setUpClass(cls):
        if not ENDPOINT or not DDBSERVE:
            raise RuntimeError("set DDBLEASE_TEST_ENDPOINT and DDBSERVE; examples/other-languages-check does")
        cls.client = boto3.client("dynamodb", endpoint_url=ENDPOINT, region_name="us-east-1",
                                  aws_access_key_id="test", aws_secret_access_key="test")
        cls.table = "py-layout-" + secrets.token_hex(4)
        for want in (1, 2):
            out = subprocess.run([DDBSERVE, "acquire", "-endpoint", ENDPOINT, "-table", cls.table, "-job", JOB] + cls.FLAGS,
                                 check=True, capture_output=True, text=True)
            assert int(out.stdout.strip()) == want

    @classmethod
    def tearDownClass(cls):
        cls.client.delete_table(TableName=cls.table)

    def test_lease_key(self):
        self.assertEqual(self.LAYOUT.lease_key(JOB), {"PK": {"S": "ddblease#job#billing"}, "SK": {"S": "lease"}})

    def test_check_fence(self):
        check_fence(self.client, self.table, JOB, 2, layout=self.LAYOUT)
        with self.assertRaises(StaleFenceError) as cm:
            check_fence(self.client, self.table, JOB, 1, layout=self.LAYOUT)
        self.assertEqual((cm.exception.fence, cm.exception.current), (1, 2))
        # The default layout names keys this table does not have: the read
        # fails, and the check with it.
        with self.assertRaises(ClientError):
            check_fence(self.client, self.table, JOB, 2)

    def test_transact_write(self):
        guarded_transact_write(self.client, self.table, JOB, 2, [{"Put": put(self.table, "app#1", "newer", self.LAYOUT)}],
                               layout=self.LAYOUT)
        with self.assertRaises(StaleFenceError):
            guarded_transact_write(self.client, self.table, JOB, 1, [{"Put": put(self.table, "app#2", "stale", self.LAYOUT)}],
                                   layout=self.LAYOUT)
        got = self.client.get_item(TableName=self.table, Key=key("app#2", self.LAYOUT), ConsistentRead=True).get("Item")
        self.assertIsNone(got)


if __name__ == "__main__":
    unittest.main()
