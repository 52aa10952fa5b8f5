// Graphile Worker's batching mode, as its performance guide turns it on for volume (issue 15):
// each process locks up to 500 jobs in one fetch and completes finished jobs in one statement.
module.exports = {
  worker: {
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
  },
};
