// An idempotent producer (InitProducerId, sequence numbers), several sends in a row.
"use strict";
const { args, emit, kafka, main } = require("./common");

main(async () => {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  for (let i = 0; i < args.sends; i++) {
    const messages = [0, 1].map((j) => ({ key: `k${i}`, value: `v${i}.${j}` }));
    const [result] = await producer.send({ topic: args.topic, acks: -1, messages });
    emit("produced", { partition: result.partition, offset: Number(result.baseOffset) });
  }
  await producer.disconnect();
});
