// pg-boss 10 for bench/throughput.py, run from the folder it is installed in.
//   node pgboss.js install   its schema and the queue "noop"
//   node pgboss.js enqueue   COUNT no-op jobs in one insert; prints when they committed (CLOCK_MONOTONIC, s)
//   node pgboss.js worker    LOOPS work() loops, each fetching and completing BATCH_SIZE jobs at a time;
//                            "ready" once they poll
// The connection string is DSN. pg-boss has no push: an idle loop polls every 0.5 s, its shortest interval.
const PgBoss = require("pg-boss");

const QUEUE = "noop";

async function install(boss) {
  await boss.createQueue(QUEUE);
  process.exit(0);
}

async function enqueue(boss) {
  await boss.insert(Array.from({ length: Number(process.env.COUNT) }, () => ({ name: QUEUE, data: {} })));
  console.log(Number(process.hrtime.bigint()) / 1e9);
  process.exit(0);
}

async function worker(boss) {
  const options = { batchSize: Number(process.env.BATCH_SIZE), pollingIntervalSeconds: 0.5 };
  for (let loop = 0; loop < Number(process.env.LOOPS); loop++) {
    await boss.work(QUEUE, options, async (jobs) => {});
  }
  console.log("ready");
}

const roles = { install, enqueue, worker };
const boss = new PgBoss({ connectionString: process.env.DSN, migrate: process.argv[2] === "install" });
boss.on("error", (error) => console.error(error));
boss.start().then(roles[process.argv[2]]).catch((error) => {
  console.error(error);
  process.exit(1);
});
