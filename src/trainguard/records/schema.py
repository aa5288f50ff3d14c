"""The store's schema: SQLAlchemy Core tables. A job row is separate from its attempts,
attempts from their replicas' runs; times are seconds since the epoch and say so in their
names; a null end time means still running."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(128), nullable=False, index=True),
    Column("spec_json", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at_s", Float, nullable=False),
    Column("ended_at_s", Float),
    Column("attempts", Integer, nullable=False, default=0),
    Column("error_code", String(32)),
    Column("error_message", Text),
    Column("master_pid", Integer),
    Column("master_host", String(255)),
    # /proc start time: tells a reused pid apart (ticks since boot pass 2**31 in 248 days)
    Column("master_started_ticks", BigInteger),
    Column("log_dir", Text, nullable=False),
    Column("cwd", Text),  # where its replicas run, for `trainguard resume`
    Column("last_step", BigInteger),  # progress, from sdk.report
    Column("last_metrics_json", Text),
    Column("last_progress_s", Float),
    # Server jobs (`trainguard submit`): who owns the job, and where it stands in the queue.
    Column("origin", String(16)),  # "server" for a submitted job; null for `trainguard run`
    Column("priority", Integer),
    Column("queued_reason", Text),
    Column("queued_at_s", Float),  # when it (last) entered the queue: FIFO order and max wait
    # The server that admitted the job, until its master writes its own identity above: it
    # answers for the job's liveness meanwhile, and is never signalled in its master's place.
    Column("starter_pid", Integer),
    Column("starter_host", String(255)),
    Column("starter_started_ticks", BigInteger),
    # A cancel asked before the master was up: held here, applied by the master when it is.
    Column("cancel_requested_at_s", Float),
)

attempts = Table(
    "attempts",
    metadata,
    Column("job_id", ForeignKey("jobs.id"), primary_key=True),
    Column("number", Integer, primary_key=True),
    Column("started_at_s", Float, nullable=False),
    Column("ended_at_s", Float),
    Column("master_addr", String(255)),
    Column("master_port", Integer),
    Column("outcome", String(32)),
    Column("reason", Text),
)

replica_runs = Table(
    "replica_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("replica", String(64), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("restart", Integer, nullable=False, default=0),  # replica restarts within the attempt
    Column("pid", Integer),
    Column("node", String(255)),
    Column("state", String(16), nullable=False),
    Column("exit_code", Integer),
    Column("signal", String(16)),
    Column("failure_class", String(32)),
    Column("rule", String(64)),
    Column("message", Text),
    Column("stop_requested", Boolean, nullable=False, default=False),
    Column("started_at_s", Float, nullable=False),
    Column("ended_at_s", Float),
    Column("log_path", Text),
    Column("fingerprint", String(16)),
    Column("tail", Text),  # the last lines it printed: what classification read
)

transitions = Table(
    "transitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("at_s", Float, nullable=False),
    Column("reason", Text),
)

restart_records = Table(
    "restart_records",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("round", Integer, nullable=False),
    Column("at_s", Float, nullable=False),
    Column("node", String(255)),
    Column("replica", String(64)),
    Column("error_code", String(32)),
    Column("error_message", Text),
    Column("error_source", String(32)),
    Column("failure_class", String(32)),
    Column("rule", String(64)),
    Column("decision", Text),
    Column("detect_ms", Float),
    Column("stop_ms", Float),
    Column("schedule_ms", Float),
    Column("start_ms", Float),
    Column("first_output_ms", Float),
    Column("fingerprint", String(16)),
    Column("matched_line", Text),
    Column("cascade", Text),  # the replicas whose failures followed this one
    Column("snapshot_id", Integer),  # the stack snapshot taken before a hang was killed
    Column("isolated", Text),  # what this failure took out of the next attempt, and why
)

# The stacks of every replica, taken before a hung job is stopped (`trainguard stacks`).
stack_snapshots = Table(
    "stack_snapshots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("at_s", Float, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("culprits", Text),
    Column("summary", Text),
    Column("duration_ms", Float),
    Column("report_json", Text, nullable=False),
    Column("snapshots_json", Text, nullable=False),
)

# The job's progress over time: one row when a reported step passes the attempt's best.
progress = Table(
    "progress",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("at_s", Float, nullable=False),
    Column("checkpoint", String(32)),  # a checkpoint committed at this step, if any
    Column("commit_ms", Float),
)

# Kinds of event the master writes besides the SDK's (`trainguard explain` lists them).
DECISION_EVENT = "decision"  # a decision no failure led to (capacity, expiry, partial success)
HANG_CLEARED_EVENT = "hang_cleared"  # a hang report withdrawn: a sign of life came meanwhile
WARM_START_EVENT = "warm_start"  # how the replicas started: forked warm, or cold and why
CUSTOM_MESSAGE_EVENT = "custom_message"  # what training code said (send_custom_message)
KEPT_CUSTOM_MESSAGES = 1000
"""A job's custom messages kept: the newest; an older one goes as a new one comes (their
rate and size are bounded at the SDK channel: master.sdk_wire)."""

# What training code said (send_custom_message) and other notable moments of a job.
events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("at_s", Float, nullable=False),
    Column("replica", String(128)),  # as named by the SDK (master.sdk_wire.MAX_REPLICA_CHARS)
    Column("kind", String(32), nullable=False),
    Column("text", Text),
)

# Every classified failure, root causes and their cascades alike (`trainguard explain`).
failure_records = Table(
    "failure_records",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("replica", String(64), nullable=False),
    Column("at_s", Float, nullable=False),
    Column("exit_code", Integer),
    Column("signal", String(16)),
    Column("failure_class", String(32)),
    Column("retryable", Boolean),
    Column("rule", String(64)),
    Column("matched_line", Text),
    Column("fingerprint", String(16)),
    Column("message", Text),
    Column("root_cause", Boolean, nullable=False),
    Column("cascade_of", String(64)),  # the root cause's replica, for a cascade
    Column("decision", Text),
    Column("confidence", Float),  # how sure the evidence made the class
    Column("phase", String(16)),  # start-up, training or unknown
    Column("step", BigInteger),  # the progress point: the step the replica had reached
    Column("notes", Text),  # what the context changed, one per line
    Column("machine", Text),  # what the machine said (JSON: classify.readings.to_json)
)

# The node ledger (R-EVID-4), shared by every job of the store: per node, each failure that
# blames the machine (with its evidence) and each change of its standing, in order
# (`trainguard nodes`; trainguard.policy.probation reads it).
node_events = Table(
    "node_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(255), nullable=False, index=True),
    Column("kind", String(16), nullable=False),  # fault, probation, released, check_passed
    Column("at_s", Float, nullable=False),
    Column("job_id", String(64)),  # the failing job (no key: the ledger outlives jobs)
    Column("attempt", Integer),
    Column("replica", String(64)),
    Column("failure_class", String(32)),
    Column("rule", String(64)),
    Column("matched_line", Text),
    Column("reason", Text),  # why it blames the machine, or why the standing changed
    Column("backend", String(16)),  # where the job ran: local, slurm, ray
)
