// The ddblease guard for a sink written in TypeScript: the same DynamoDB
// requests as the Go Guard (docs/guard.md, "From other languages"), so that
// a Go writer and this one agree on one item's fence high-water mark.
//
//   checkFence            Guard.Check: a consistent read of the lease item
//   guardedPut            Guard.Put: the item keeps its fence high-water mark
//   guardedUpdate         Guard.Update: the same, for an UpdateItem
//   guardedTransactWrite  Guard.TransactWrite: a ConditionCheck on the lease
//                         item's fence, and the mark on every item written
//
// Every function fails closed: any error rejects the write.

import { randomBytes } from "node:crypto";
import {
  ConditionalCheckFailedException,
  DescribeTableCommand,
  DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  TransactionCanceledException,
  TransactWriteItemsCommand,
  UpdateItemCommand,
  type AttributeValue,
  type PutItemCommandInput,
  type TransactWriteItem,
  type UpdateItemCommandInput,
} from "@aws-sdk/client-dynamodb";

type Item = Record<string, AttributeValue>;

// The fields of a Put, Update or Delete (action or request) the guard adds to.
interface Conditioned {
  ConditionExpression?: string;
  ExpressionAttributeNames?: Record<string, string>;
  ExpressionAttributeValues?: Item;
}

/**
 * Where the Go library keeps its items in the lease table (Go:
 * ddblease.Layout): the names of the table's partition and sort keys
 * ("pk" and "sk" by default) and the prefix of the library's partition
 * keys (none by default). Every writer of a job must use the replicas'
 * layout.
 */
export interface Layout {
  partitionKey?: string;
  sortKey?: string;
  prefix?: string;
}

/** The key of a job's lease item: partition `<prefix>job#<job>`, sort key "lease". */
export function leaseKey(job: string, layout: Layout = {}): Item {
  const pk = layout.partitionKey || "pk";
  const sk = layout.sortKey || "sk";
  if (pk === sk) {
    throw new RangeError(`Layout: partitionKey and sortKey are both ${JSON.stringify(pk)}`);
  }
  return { [pk]: { S: `${layout.prefix ?? ""}job#${job}` }, [sk]: { S: "lease" } };
}

/** The lease item's attribute holding the job's current fence (a number). */
export const LEASE_FENCE_ATTRIBUTE = "fence";
/** Default of the guarded item's fence high-water mark (Go: DefaultGuardFenceAttribute). */
export const FENCE_ATTRIBUTE = "fence";
/** Default of the guarded item's write token (Go: DefaultGuardTokenAttribute). */
export const TOKEN_ATTRIBUTE = "fenceWrite";

// The guard's placeholders; the caller's expressions must not use any
// placeholder starting with #ddblease or :ddblease.
const FENCE_NAME = "#ddbleaseFence";
const FENCE_VALUE = ":ddbleaseFence";
const TOKEN_NAME = "#ddbleaseToken";
const TOKEN_VALUE = ":ddbleaseToken";

/** The names of the mark's attributes; every writer of an item must use the same ones. */
export interface MarkOptions {
  fenceAttribute?: string;
  tokenAttribute?: string;
}

/** StaleFenceError is a write or check refused because a newer fence exists. */
export class StaleFenceError extends Error {
  constructor(
    readonly fence: number,
    /** The job's current fence (0: no lease item), or the item's mark. */
    readonly current: number,
    options?: { cause?: unknown },
  ) {
    super(
      current === 0
        ? `stale fence: fence ${fence} refused: the job has no lease`
        : `stale fence: fence ${fence} refused: the current fence is ${current}`,
      options,
    );
    this.name = "StaleFenceError";
  }
}

/**
 * checkFence reads the job's lease item with a consistent read and resolves
 * only if its fence equals fence. Not atomic with what follows: use it for
 * sinks outside DynamoDB.
 */
export async function checkFence(client: DynamoDBClient, table: string, job: string, fence: number, layout: Layout = {}): Promise<void> {
  const out = await client.send(new GetItemCommand({ TableName: table, Key: leaseKey(job, layout), ConsistentRead: true }));
  const current = out.Item ? fenceOf(out.Item, LEASE_FENCE_ATTRIBUTE) : 0;
  if (current !== fence) {
    throw new StaleFenceError(fence, current);
  }
}

/**
 * guardedPut writes input.Item with the item's fence attribute set to fence
 * and a fresh write token, on condition that the stored item has no fence
 * attribute or one not above fence, does not carry this write's token, and
 * input's own ConditionExpression holds. A fence lower than the highest
 * that wrote this item is refused with a StaleFenceError.
 */
export async function guardedPut(client: DynamoDBClient, fence: number, input: PutItemCommandInput, opts: MarkOptions = {}): Promise<void> {
  const m = marker(opts);
  const tok = token();
  const put = m.put({ ...input }, fence, tok);
  try {
    await client.send(new PutItemCommand(put));
  } catch (err) {
    await m.explain(err, fence, tok, async () =>
      read(client, input.TableName!, await keyOf(client, input.TableName!, input.Item!)),
    );
  }
}

/**
 * guardedUpdate applies input with the mark's assignments added to its SET
 * clause, on the conditions of guardedPut. Its UpdateExpression must not
 * refer to the mark's or the token's attribute.
 */
export async function guardedUpdate(client: DynamoDBClient, fence: number, input: UpdateItemCommandInput, opts: MarkOptions = {}): Promise<void> {
  const m = marker(opts);
  const tok = token();
  const upd = m.update({ ...input }, fence, tok);
  try {
    await client.send(new UpdateItemCommand(upd));
  } catch (err) {
    await m.explain(err, fence, tok, () => read(client, input.TableName!, input.Key!));
  }
}

/**
 * guardedTransactWrite applies items in one TransactWriteItems together
 * with a ConditionCheck that the job's lease item holds exactly fence: any
 * fence but the current one is refused. Every Put and Update among items
 * sets the mark as guardedPut does, and every Delete is on the mark's
 * condition, so that forms mixed on one item agree. A conflict with
 * another write (TransactionConflict) is retried for up to five seconds,
 * under the same ClientRequestToken.
 */
export async function guardedTransactWrite(
  client: DynamoDBClient, table: string, job: string, fence: number, items: TransactWriteItem[],
  opts: MarkOptions & { layout?: Layout } = {},
): Promise<void> {
  if (items.length < 1 || items.length > 99) {
    throw new RangeError(`guardedTransactWrite: ${items.length} items; between 1 and 99 are allowed`);
  }
  const m = marker(opts);
  const tok = token();
  const all: TransactWriteItem[] = [
    {
      ConditionCheck: {
        TableName: table,
        Key: leaseKey(job, opts.layout),
        ConditionExpression: "#fence = :fence",
        ExpressionAttributeNames: { "#fence": LEASE_FENCE_ATTRIBUTE },
        ExpressionAttributeValues: { ":fence": { N: String(fence) } },
        ReturnValuesOnConditionCheckFailure: "ALL_OLD",
      },
    },
    ...items.map((it) => m.action(it, fence, tok)),
  ];
  const request = { TransactItems: all, ClientRequestToken: tok };
  const deadline = Date.now() + 5000;
  for (let wait = 20; ; wait = Math.min(2 * wait, 320)) {
    try {
      await client.send(new TransactWriteItemsCommand(request));
      return;
    } catch (err) {
      if (!(err instanceof TransactionCanceledException)) {
        throw err;
      }
      const reasons = err.CancellationReasons ?? [];
      const conflict = reasons.some((r) => r.Code === "TransactionConflict") &&
        reasons.every((r) => r.Code === "None" || r.Code === "TransactionConflict");
      if (conflict && Date.now() + wait < deadline) {
        await new Promise((res) => setTimeout(res, wait * (0.5 + Math.random())));
        continue;
      }
      if (reasons[0]?.Code === "ConditionalCheckFailed") {
        const lease = reasons[0].Item ?? (await read(client, table, leaseKey(job, opts.layout)));
        throw new StaleFenceError(fence, lease ? fenceOf(lease, LEASE_FENCE_ATTRIBUTE) : 0, { cause: err });
      }
      for (let i = 0; i < items.length; i++) {
        const r = reasons[i + 1];
        const it = items[i];
        if (r?.Code !== "ConditionalCheckFailed" || it.ConditionCheck) {
          continue;
        }
        const stored = r.Item ?? (await readAction(client, it));
        if (m.carries(stored, tok)) {
          return; // an earlier attempt landed: its answer was lost
        }
        const mark = m.markOf(stored);
        if (mark > fence) {
          throw new StaleFenceError(fence, mark, { cause: err });
        }
      }
      throw err; // a condition of the caller's failed
    }
  }
}

function marker(opts: MarkOptions) {
  const fenceAttr = opts.fenceAttribute ?? FENCE_ATTRIBUTE;
  const tokenAttr = opts.tokenAttribute ?? TOKEN_ATTRIBUTE;
  if (fenceAttr === tokenAttr) {
    throw new Error(`fence and token attributes are both "${fenceAttr}"`);
  }

  // condition ANDs the mark's condition (and, with tok, the token's) with
  // the caller's, and adds the guard's placeholders.
  function condition<T extends Conditioned>(input: T, fence: number, tok: string | null): T {
    for (const k of [...Object.keys(input.ExpressionAttributeNames ?? {}), ...Object.keys(input.ExpressionAttributeValues ?? {})]) {
      if (reserved(k)) throw new Error(`the placeholder ${k} is reserved for the guard`);
    }
    const own = (input.ConditionExpression ?? "").trim();
    if (reserved(own)) throw new Error("the ConditionExpression uses a placeholder reserved for the guard");
    checkParentheses(own);
    const names: Record<string, string> = { ...input.ExpressionAttributeNames, [FENCE_NAME]: fenceAttr };
    const values: Item = { ...input.ExpressionAttributeValues, [FENCE_VALUE]: { N: String(fence) } };
    let cond = `(attribute_not_exists(${FENCE_NAME}) OR ${FENCE_NAME} <= ${FENCE_VALUE})`;
    if (tok !== null) {
      names[TOKEN_NAME] = tokenAttr;
      values[TOKEN_VALUE] = { S: tok };
      cond += ` AND (attribute_not_exists(${TOKEN_NAME}) OR ${TOKEN_NAME} <> ${TOKEN_VALUE})`;
    }
    if (own !== "") cond += ` AND (${own})`;
    return {
      ...input,
      ConditionExpression: cond,
      ExpressionAttributeNames: names,
      ExpressionAttributeValues: values,
      ReturnValuesOnConditionCheckFailure: "ALL_OLD",
    } as T;
  }

  function put<T extends Conditioned & { Item?: Item }>(input: T, fence: number, tok: string): T {
    if (!input.Item) throw new Error("the Put has no Item");
    if (tokenAttr in input.Item) throw new Error(`the item holds attribute "${tokenAttr}", which the guard keeps`);
    const item = { ...input.Item, [fenceAttr]: { N: String(fence) }, [tokenAttr]: { S: tok } };
    return condition({ ...input, Item: item }, fence, tok);
  }

  function update<T extends Conditioned & { UpdateExpression?: string }>(input: T, fence: number, tok: string): T {
    const expr = input.UpdateExpression ?? "";
    if (reserved(expr)) throw new Error("the UpdateExpression uses a placeholder reserved for the guard");
    // Conservative: refuses any mention of the mark's attributes, nested
    // paths included; the Go guard refuses only top-level ones.
    for (const a of [fenceAttr, tokenAttr]) {
      const placeholders = Object.entries(input.ExpressionAttributeNames ?? {}).filter(([, v]) => v === a).map(([k]) => k);
      if (mentions(expr, a) || placeholders.some((p) => mentions(expr, p))) {
        throw new Error(`the UpdateExpression refers to attribute "${a}", which the guard keeps`);
      }
    }
    return condition({ ...input, UpdateExpression: withFenceSet(expr) }, fence, tok);
  }

  return {
    put,
    update,
    action(it: TransactWriteItem, fence: number, tok: string): TransactWriteItem {
      if (it.Put) return { Put: put({ ...it.Put }, fence, tok) };
      if (it.Update) return { Update: update({ ...it.Update }, fence, tok) };
      if (it.Delete) return { Delete: condition({ ...it.Delete }, fence, null) };
      return it;
    },
    markOf(item: Item | undefined): number {
      return item && fenceAttr in item ? fenceOf(item, fenceAttr) : 0;
    },
    carries(item: Item | undefined, tok: string): boolean {
      return item?.[tokenAttr]?.S === tok;
    },
    // explain turns a failed guarded write into its outcome: applied (the
    // item carries the write's token), a StaleFenceError (its mark is above
    // fence), or the error itself.
    async explain(err: unknown, fence: number, tok: string, readItem: () => Promise<Item | undefined>): Promise<void> {
      if (!(err instanceof ConditionalCheckFailedException)) {
        throw err; // the Go guard also reads the item back when no answer came
      }
      const stored = err.Item ?? (await readItem());
      if (this.carries(stored, tok)) {
        return; // an SDK retry of a write that landed
      }
      const mark = this.markOf(stored);
      if (mark > fence) {
        throw new StaleFenceError(fence, mark, { cause: err });
      }
      throw err;
    },
  };
}

// withFenceSet adds the guard's assignments to the SET clause of an update
// expression, creating the clause if there is none.
function withFenceSet(expr: string): string {
  const set = `${FENCE_NAME} = ${FENCE_VALUE}, ${TOKEN_NAME} = ${TOKEN_VALUE}`;
  if (expr.trim() === "") return `SET ${set}`;
  const m = /(?<![A-Za-z0-9_#:.])SET(?![A-Za-z0-9_.])/i.exec(expr);
  if (m) return `${expr.slice(0, m.index + 3)} ${set},${expr.slice(m.index + 3)}`;
  return `SET ${set} ${expr}`;
}

function mentions(expr: string, name: string): boolean {
  const esc = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`(?<![A-Za-z0-9_#:])${esc}(?![A-Za-z0-9_])`).test(expr);
}

function reserved(s: string): boolean {
  const l = s.toLowerCase();
  return l.includes("#ddblease") || l.includes(":ddblease");
}

// checkParentheses refuses a condition that could escape the parentheses
// it is put in.
function checkParentheses(cond: string): void {
  let depth = 0;
  for (const c of cond) {
    if (c === "(") depth++;
    if (c === ")" && --depth < 0) throw new Error(`condition ${JSON.stringify(cond)} closes a parenthesis it did not open`);
  }
  if (depth !== 0) throw new Error(`condition ${JSON.stringify(cond)} leaves a parenthesis open`);
}

function fenceOf(item: Item, attr: string): number {
  const n = Number(item[attr]?.N);
  if (!Number.isSafeInteger(n)) {
    throw new Error(`malformed item: attribute "${attr}" is not an integer`);
  }
  return n;
}

function token(): string {
  return randomBytes(16).toString("hex");
}

async function read(client: DynamoDBClient, table: string, key: Item): Promise<Item | undefined> {
  const out = await client.send(new GetItemCommand({ TableName: table, Key: key, ConsistentRead: true }));
  return out.Item;
}

async function readAction(client: DynamoDBClient, it: TransactWriteItem): Promise<Item | undefined> {
  if (it.Put) return read(client, it.Put.TableName!, await keyOf(client, it.Put.TableName!, it.Put.Item!));
  if (it.Update) return read(client, it.Update.TableName!, it.Update.Key!);
  if (it.Delete) return read(client, it.Delete.TableName!, it.Delete.Key!);
  return undefined;
}

async function keyOf(client: DynamoDBClient, table: string, item: Item): Promise<Item> {
  const out = await client.send(new DescribeTableCommand({ TableName: table }));
  const key: Item = {};
  for (const k of out.Table?.KeySchema ?? []) {
    key[k.AttributeName!] = item[k.AttributeName!];
  }
  return key;
}
