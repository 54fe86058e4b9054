// A transactional producer commits, aborts and commits again; then a read_committed and
// a read_uncommitted consumer each read the topic up to its last committed record.
"use strict";
const { args, emit, kafka, consumeUntil, main } = require("./common");

main(async () => {
  const producer = kafka.producer({
    transactionalId: args.transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await producer.connect();
  for (const [values, end] of [
    [["c1", "c2"], "commit"],
    [["a1", "a2"], "abort"],
    [["c3"], "commit"],
  ]) {
    const transaction = await producer.transaction();
    await transaction.send({ topic: args.topic, messages: values.map((value) => ({ value })) });
    await transaction[end]();
    emit(end, { values });
  }
  await producer.disconnect();

  for (const readUncommitted of [false, true]) {
    const consumer = kafka.consumer({ groupId: `${args.topic}-${readUncommitted}`, readUncommitted });
    await consumer.connect();
    const records = await consumeUntil(consumer, args.topic, (r) => r.at(-1).value === "c3");
    await consumer.disconnect();
    emit("read", { readUncommitted, values: records.map((r) => r.value) });
  }
});
