// Consume-transform-produce: offsets sent in a transaction (sendOffsets) are the
// group's committed offsets only once it commits; an aborted one's never. Before each
// commit the script says "pending" and waits for a line on stdin, so that the test
// looks at the broker mid-transaction.
"use strict";
const readline = require("node:readline");
const { args, emit, kafka, fetchCommitted, main } = require("./common");

const stdin = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

main(async () => {
  const admin = kafka.admin();
  await admin.connect();
  const producer = kafka.producer({
    transactionalId: args.transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await producer.connect();
  for (const [offset, end] of [
    [2, "abort"],
    [3, "commit"],
  ]) {
    const transaction = await producer.transaction();
    await transaction.send({ topic: args.output, messages: [{ value: `upto-${offset}` }] });
    await transaction.sendOffsets({
      consumerGroupId: args.group,
      topics: [{ topic: args.input, partitions: [{ partition: 0, offset: String(offset) }] }],
    });
    emit("pending", { offset, committed: await fetchCommitted(admin, args.group, args.input) });
    await stdin.next();
    await transaction[end]();
    emit(end, { offset, committed: await fetchCommitted(admin, args.group, args.input) });
  }
  await producer.disconnect();
  await admin.disconnect();
});
