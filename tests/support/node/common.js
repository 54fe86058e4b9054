// Shared by the KafkaJS scripts that tests/kafka/test_kafka_other_clients.py runs: one JSON
// argument in, JSON lines out on stdout, KafkaJS's own log on stderr, and a watchdog.
"use strict";
const { Kafka, logLevel } = require("kafkajs");

const args = JSON.parse(process.argv[2]);

// The test's subprocess timeout is the outer bound; this one ends a hung script first,
// saying where it was.
setTimeout(() => {
  process.stderr.write("watchdog: no end within 20 s\n");
  process.exit(3);
}, 20000).unref();

function emit(event, fields = {}) {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

const kafka = new Kafka({
  clientId: args.clientId || "kafkajs",
  brokers: [args.bootstrap],
  logLevel: logLevel.WARN,
  logCreator: () => ({ namespace, log }) =>
    process.stderr.write(`${namespace}: ${JSON.stringify(log)}\n`),
});

// Reads a consumer's records until `done(records)`: every record as
// {key, value, partition, offset}.
async function consumeUntil(consumer, topic, done) {
  const records = [];
  await consumer.subscribe({ topic, fromBeginning: true });
  await new Promise((resolve, reject) => {
    consumer
      .run({
        eachMessage: async ({ partition, message }) => {
          records.push({
            key: message.key && message.key.toString(),
            value: message.value.toString(),
            partition,
            offset: Number(message.offset),
          });
          if (done(records)) resolve();
        },
      })
      .catch(reject);
  });
  return records;
}

// The group's committed offsets as the admin client fetches them: {partition: offset}.
async function fetchCommitted(admin, groupId, topic) {
  const [answer] = await admin.fetchOffsets({ groupId, topics: [topic] });
  return Object.fromEntries(answer.partitions.map((p) => [p.partition, Number(p.offset)]));
}

function main(body) {
  body().then(
    () => process.exit(0),
    (error) => {
      process.stderr.write(`${error.stack || error}\n`);
      process.exit(1);
    },
  );
}

module.exports = { args, emit, kafka, consumeUntil, fetchCommitted, main };
