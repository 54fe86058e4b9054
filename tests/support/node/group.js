// Keyed records produced, then read back by a consumer group that commits them.
"use strict";
const { args, emit, kafka, consumeUntil, fetchCommitted, main } = require("./common");

main(async () => {
  const producer = kafka.producer();
  await producer.connect();
  const messages = args.keys.map((key) => ({ key, value: `value-${key}` }));
  const sent = await producer.send({ topic: args.topic, messages });
  await producer.disconnect();
  emit("produced", { partitions: sent.map((r) => [r.partition, Number(r.baseOffset)]) });

  const consumer = kafka.consumer({ groupId: args.group });
  await consumer.connect();
  const records = await consumeUntil(consumer, args.topic, (r) => r.length === messages.length);
  await consumer.disconnect(); // commits what eachMessage resolved
  for (const record of records) emit("consumed", record);

  const admin = kafka.admin();
  await admin.connect();
  emit("committed", { offsets: await fetchCommitted(admin, args.group, args.topic) });
  await admin.disconnect();
});
