// Runs the guard against a DynamoDB-compatible server with transactions,
// with the lease item and some guarded items written by the Go library
// (internal/cmd/ddbserve): a current fence is accepted, a stale one
// refused, by every form, and the Go guard and this one agree on one
// item's mark.
//
//   DDBLEASE_TEST_ENDPOINT=http://127.0.0.1:8000 DDBSERVE=/path/to/ddbserve npm test
//
// examples/other-languages-check sets both.

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { DeleteTableCommand, DynamoDBClient, GetItemCommand, TransactionCanceledException, type AttributeValue } from "@aws-sdk/client-dynamodb";
import { checkFence, guardedPut, guardedTransactWrite, guardedUpdate, leaseKey, StaleFenceError, type Layout } from "./guard.js";

const endpoint = process.env.DDBLEASE_TEST_ENDPOINT;
const ddbserve = process.env.DDBSERVE;
if (!endpoint || !ddbserve) {
  throw new Error("set DDBLEASE_TEST_ENDPOINT (a server with transactions) and DDBSERVE (the built internal/cmd/ddbserve); examples/other-languages-check does");
}
const client = new DynamoDBClient({
  endpoint,
  region: "us-east-1",
  credentials: { accessKeyId: "test", secretAccessKey: "test" },
});
const table = `ts-guard-${randomBytes(4).toString("hex")}`;
const job = "billing";

// go runs ddbserve and returns its exit status and output.
function go(...args: string[]): { status: number | null; out: string; err: string } {
  const r = spawnSync(ddbserve!, [...args.slice(0, 1), "-endpoint", endpoint!, "-table", table, ...args.slice(1)], { encoding: "utf8" });
  return { status: r.status, out: r.stdout, err: r.stderr };
}

// acquire takes the job's lease through the Go library: a new fence.
function acquire(j = job): number {
  return Number(execFileSync(ddbserve!, ["acquire", "-endpoint", endpoint!, "-table", table, "-job", j], { encoding: "utf8" }).trim());
}

// key is the key of an item of the test's own in the lease table (sort
// key "item", as ddbserve put writes it).
const key = (pk: string, layout: Layout = {}) => ({
  [layout.partitionKey || "pk"]: { S: pk }, [layout.sortKey || "sk"]: { S: "item" },
});

async function get(pk: string): Promise<Record<string, AttributeValue> | undefined> {
  const out = await client.send(new GetItemCommand({ TableName: table, Key: key(pk), ConsistentRead: true }));
  return out.Item;
}

async function assertStale(p: Promise<unknown>, fence: number, current: number): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof StaleFenceError, `want a StaleFenceError, got ${err}`);
    assert.equal(err.fence, fence);
    assert.equal(err.current, current);
    return true;
  });
}

const put = (pk: string, v: string, t = table, layout: Layout = {}) => ({ TableName: t, Item: { ...key(pk, layout), v: { S: v } } });
const update = (pk: string, v: string) => ({
  TableName: table, Key: key(pk), UpdateExpression: "SET v = :v", ExpressionAttributeValues: { ":v": { S: v } },
});

describe("guard from TypeScript", () => {
  before(() => {
    assert.equal(acquire(), 1);
    assert.equal(acquire(), 2); // fence 1 is stale from now on
  });
  after(async () => {
    await client.send(new DeleteTableCommand({ TableName: table }));
  });

  test("checkFence accepts the current fence only", async () => {
    await checkFence(client, table, job, 2);
    await assertStale(checkFence(client, table, job, 1), 1, 2);
    await assertStale(checkFence(client, table, "no-such-job", 1), 1, 0);
  });

  test("guardedPut keeps the item's mark", async () => {
    await guardedPut(client, 2, put("ts#put", "newer"));
    const item = await get("ts#put");
    assert.equal(item?.fence?.N, "2");
    assert.ok(item?.fenceWrite?.S, "the write token is stored");
    await assertStale(guardedPut(client, 1, put("ts#put", "stale")), 1, 2);
    assert.equal((await get("ts#put"))?.v?.S, "newer");
    // The caller's own condition failing is not a stale fence.
    await assert.rejects(guardedPut(client, 2, { ...put("ts#put", "again"), ConditionExpression: "attribute_not_exists(pk)" }),
      (err: unknown) => !(err instanceof StaleFenceError));
  });

  test("guardedUpdate keeps the item's mark", async () => {
    await guardedUpdate(client, 2, update("ts#update", "newer"));
    assert.equal((await get("ts#update"))?.fence?.N, "2");
    await assertStale(guardedUpdate(client, 1, update("ts#update", "stale")), 1, 2);
    await assertStale(guardedPut(client, 1, put("ts#update", "stale")), 1, 2);
    assert.equal((await get("ts#update"))?.v?.S, "newer");
  });

  test("guardedTransactWrite checks the lease item's fence and keeps the mark", async () => {
    await guardedTransactWrite(client, table, job, 2, [{ Put: put("ts#txn", "newer") }, { Update: update("ts#txn2", "newer") }]);
    assert.equal((await get("ts#txn"))?.fence?.N, "2");
    assert.equal((await get("ts#txn2"))?.fence?.N, "2");
    await assertStale(guardedTransactWrite(client, table, job, 1, [{ Put: put("ts#txn-stale", "stale") }]), 1, 2);
    assert.equal(await get("ts#txn-stale"), undefined, "nothing is written");
    // A stale Put of an item the transaction wrote is refused by its mark.
    await assertStale(guardedPut(client, 1, put("ts#txn", "stale")), 1, 2);
    // The caller's own condition failing comes back as the SDK's error.
    await assert.rejects(
      guardedTransactWrite(client, table, job, 2, [{ Put: { ...put("ts#txn", "x"), ConditionExpression: "attribute_not_exists(pk)" } }]),
      (err: unknown) => err instanceof TransactionCanceledException);
  });

  test("a mark written by the Go guard refuses a lower fence here", async () => {
    let r = go("put", "-job", job, "-fence", "2", "-pk", "go#1", "-v", "go");
    assert.equal(r.status, 0, r.err);
    assert.equal((await get("go#1"))?.fence?.N, "2");
    await assertStale(guardedPut(client, 1, put("go#1", "stale")), 1, 2);
    await assertStale(guardedUpdate(client, 1, update("go#1", "stale")), 1, 2);
    assert.equal((await get("go#1"))?.v?.S, "go");
    // A mark above this job's current fence (another job's guard wrote
    // the item with fence 3) refuses a transaction too.
    r = go("put", "-job", "ledger", "-fence", "3", "-pk", "go#shared", "-v", "ledger");
    assert.equal(r.status, 0, r.err);
    await assertStale(guardedTransactWrite(client, table, job, 2, [{ Put: put("go#shared", "billing") }]), 2, 3);
    await assertStale(guardedTransactWrite(client, table, job, 2, [{ Delete: { TableName: table, Key: key("go#shared") } }]), 2, 3);
    assert.equal((await get("go#shared"))?.v?.S, "ledger");
  });

  test("a mark written here refuses a lower fence in the Go guard", async () => {
    await guardedPut(client, 2, put("ts#for-go", "ts"));
    const r = go("put", "-job", job, "-fence", "1", "-pk", "ts#for-go", "-v", "stale");
    assert.equal(r.status, 3, `the Go guard refuses fence 1: ${r.err}`);
    assert.match(r.err, /stale fence/);
    assert.equal((await get("ts#for-go"))?.v?.S, "ts");
    assert.equal(go("put", "-job", job, "-fence", "2", "-pk", "ts#for-go", "-v", "go").status, 0, "the current fence is accepted");
  });
});

describe("guard from TypeScript, on a table of a single-table design", () => {
  const layout: Layout = { partitionKey: "PK", sortKey: "SK", prefix: "ddblease#" };
  const flags = ["-partition-key", "PK", "-sort-key", "SK", "-prefix", "ddblease#"];
  const other = `ts-layout-${randomBytes(4).toString("hex")}`;
  before(() => {
    for (const want of [1, 2]) {
      const out: string = execFileSync(ddbserve!, ["acquire", "-endpoint", endpoint!, "-table", other, "-job", job, ...flags], { encoding: "utf8" });
      assert.equal(Number(out.trim()), want);
    }
  });
  after(async () => {
    await client.send(new DeleteTableCommand({ TableName: other }));
    client.destroy();
  });

  test("leaseKey follows the layout", () => {
    assert.deepEqual(leaseKey(job, layout), { PK: { S: "ddblease#job#billing" }, SK: { S: "lease" } });
  });

  test("checkFence and guardedTransactWrite find the lease item by the layout", async () => {
    await checkFence(client, other, job, 2, layout);
    await assertStale(checkFence(client, other, job, 1, layout), 1, 2);
    // The default layout names keys this table does not have: the read fails, and the check with it.
    await assert.rejects(checkFence(client, other, job, 2));
    await guardedTransactWrite(client, other, job, 2, [{ Put: put("app#1", "newer", other, layout) }], { layout });
    await assertStale(guardedTransactWrite(client, other, job, 1, [{ Put: put("app#2", "stale", other, layout) }], { layout }), 1, 2);
  });
});
