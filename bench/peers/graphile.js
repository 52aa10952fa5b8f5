// Graphile Worker 0.17 for bench/throughput.py, run from the folder it is installed in.
//   node graphile.js install   its schema
//   node graphile.js enqueue   COUNT no-op jobs in one call; prints when they committed (CLOCK_MONOTONIC, s)
//   node graphile.js worker    CONCURRENCY jobs at once; BATCHING=1 adds graphile.config.js; "ready" once listening
// The connection string is DSN. Its logger is silenced: it logs every job, which we do not.
const { Logger, makeWorkerUtils, run, runMigrations } = require("graphile-worker");

const connectionString = process.env.DSN;
const logger = new Logger(() => () => {});

async function enqueue() {
  const utils = await makeWorkerUtils({ connectionString, logger });
  const jobs = Array.from({ length: Number(process.env.COUNT) }, () => ({ identifier: "noop", payload: {} }));
  await utils.addJobs(jobs);
  console.log(Number(process.hrtime.bigint()) / 1e9);
  await utils.release();
}

async function worker() {
  const runner = await run({
    preset: process.env.BATCHING === "1" ? require("./graphile.config.js") : {},
    connectionString,
    concurrency: Number(process.env.CONCURRENCY),
    pollInterval: 1000, // idle, every system waits 1 s (its default: 2 s); new jobs are pushed by NOTIFY
    logger,
    noHandleSignals: true,
    taskList: { noop: async () => {} },
  });
  console.log("ready");
  await runner.promise;
}

const roles = { install: () => runMigrations({ connectionString, logger }), enqueue, worker };
roles[process.argv[2]]().catch((error) => {
  console.error(error);
  process.exit(1);
});
