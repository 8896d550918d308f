"""The store's data model: one row per thing, ids everywhere, nothing overwritten.

``SCHEMA_VERSION`` is written into the ``meta`` table. A store from a newer version is
refused (its data is left untouched); older versions are migrated forward by the
functions in ``MIGRATIONS``. ``docs/architecture.md`` documents every column.
"""
from __future__ import annotations

SCHEMA_VERSION = 11

TABLES: dict[str, str] = {
    "meta": """
        key VARCHAR PRIMARY KEY,
        value VARCHAR
    """,
    "runs": """
        run_id VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL,          -- sample | generate | branch | minirun | import
        name VARCHAR,
        policy VARCHAR,
        task VARCHAR,
        config JSON,
        parent_run_id VARCHAR,
        created_at TIMESTAMP,
        status VARCHAR,                 -- running | done | failed | cancelled | interrupted | stopped
        error VARCHAR,                  -- why a run failed (schema 4)
        owner VARCHAR                   -- the process that made it, "host:pid" (schema 11): a shared store marks a
                                        --   'running' run interrupted only when its owner is gone
    """,
    "prompts": """
        prompt_id VARCHAR PRIMARY KEY,  -- hash of task + text: one id per distinct prompt
        task VARCHAR,
        text VARCHAR NOT NULL,
        gold JSON,
        meta JSON,
        messages JSON                   -- a chat prompt's messages [{role, content}] (schema 8); NULL: text alone
    """,
    "rollouts": """
        rollout_id VARCHAR PRIMARY KEY,
        run_id VARCHAR NOT NULL,
        train_step INTEGER,
        prompt_id VARCHAR NOT NULL,
        group_id VARCHAR NOT NULL,      -- the completions sampled together for one prompt
        sample_idx INTEGER,
        text VARCHAR,
        n_tokens INTEGER,
        finish_reason VARCHAR,          -- stop | length
        parent_rollout_id VARCHAR,      -- set on fork branches
        fork_pos INTEGER,
        forced_token_id INTEGER,
        policy_version VARCHAR,
        created_at TIMESTAMP,
        train_advantage DOUBLE,         -- mini-runs: the advantage the loss used for this rollout (schema 4)
        enriched_by VARCHAR,            -- imports: the policy version whose teacher forcing wrote this rollout's
                                        --   token rows (schema 6); NULL: the tokens came with the rollout
        prompt_text VARCHAR,            -- the exact text the policy continued (a chat template applied) (schema 8);
                                        --   NULL: the prompt's text as it is
        answer VARCHAR,                 -- the final answer the completion states, read by its task (schema 8)
        correct BOOLEAN,                -- that answer verified against the gold one by the task, or the import's own
                                        --   correctness field (schema 8); NULL: no gold answer to check against
        n_turns INTEGER,                -- agent trajectories (schema 9): turns of the completion (1: a single answer),
        n_tool_calls INTEGER,           --   tool calls the policy made,
        n_tool_errors INTEGER,          --   calls that failed (bad JSON, unknown tool, the tool raised / timed out)
        engine VARCHAR,                 -- what sampled it and reported tokens.logprob, the behaviour log-prob (schema 10):
                                        --   'torch 2.13.0 cpu float32', a backend's URL and engine, an import's column
        train_policy_version VARCHAR,   -- who recomputed tokens.train_logprob (schema 10): the policy version
        train_engine VARCHAR            --   and the engine (a trainer, or Rescore's teacher forcing); NULL: not recomputed
    """,
    "tokens": """                       -- a view (schema 7): the rows of table token_rows and of the
                                        --   Parquet shards in token_shards; see TOKEN_ROWS
        rollout_id VARCHAR NOT NULL,
        pos INTEGER NOT NULL,           -- 0-based index in the completion
        token_id INTEGER,
        token_text VARCHAR,
        logprob FLOAT,                  -- log pi(token | context), temperature 1
        entropy FLOAT,                  -- entropy of the full next-token distribution, nats
        topk_ids INTEGER[],
        topk_logprobs FLOAT[],
        ref_logprob FLOAT,
        step_idx INTEGER,               -- which reasoning step the token belongs to (NULL: none)
        train_weight FLOAT,             -- mini-runs: advantage x entropy mask this token was trained with (schema 4)
        turn_idx INTEGER,               -- the turn (turns.turn_idx) the token belongs to (schema 9); NULL: turn 0
        trained BOOLEAN,                -- the loss mask: false on tokens the policy did not write (tool responses:
                                        --   no logprob / entropy); NULL: trained
        train_logprob FLOAT,            -- log pi_train(token | context) recomputed by the training side (a trainer, or
                                        --   Rescore by a chosen policy and precision) (schema 10); NULL: not recomputed
        train_rank INTEGER              -- the token's rank under that recomputation (1: its argmax); NULL: unknown
    """,
    "turns": """
        rollout_id VARCHAR NOT NULL,    -- an agent trajectory's turns after its prompt, in order (schema 9); a
        turn_idx INTEGER NOT NULL,      --   rollout without rows here is one assistant turn over all its tokens
        role VARCHAR NOT NULL,          -- assistant | tool | user | system
        start_pos INTEGER,              -- its tokens: pos start_pos .. end_pos - 1 (NULL: a turn without tokens)
        end_pos INTEGER,
        content VARCHAR,                -- the turn's text (a tool turn: the tool's response as the policy saw it)
        tool_name VARCHAR,              -- an assistant turn's call / the tool that answered it
        tool_args VARCHAR,              -- the call's arguments, JSON text as the policy wrote it
        tool_call_id VARCHAR,
        error VARCHAR                   -- a tool turn: why the call failed (NULL: it ran)
    """,
    "turn_rewards": """
        rollout_id VARCHAR NOT NULL,    -- a reward per turn (schema 9)
        turn_idx INTEGER NOT NULL,
        source VARCHAR NOT NULL,        -- a rule version's id (its turn_reward, or an import's per-turn scores),
                                        --   or ig-<policy version> (information gain per turn)
        value DOUBLE
    """,
    "token_scores": """
        rollout_id VARCHAR NOT NULL,    -- a stored rollout re-scored (teacher-forced) by another policy
        pos INTEGER NOT NULL,
        policy_version VARCHAR NOT NULL,-- folder@weights-hash of the scoring policy
        logprob FLOAT,
        entropy FLOAT,
        value FLOAT,                    -- a critic's V(s_pos), the state before token pos (schema 3)
        engine VARCHAR,                 -- what computed it: 'torch 2.13.0 cpu float32', a backend (schema 10)
        rank INTEGER                    -- the stored token's rank under the scoring policy (1: its argmax) (schema 10)
    """,
    "rule_versions": """
        rule_version_id VARCHAR PRIMARY KEY,
        name VARCHAR,
        source VARCHAR,
        sha256 VARCHAR,
        created_at TIMESTAMP,
        note VARCHAR
    """,
    "rewards": """
        rollout_id VARCHAR NOT NULL,
        rule_version_id VARCHAR NOT NULL,
        component VARCHAR NOT NULL,     -- 'total' is the composed reward
        value DOUBLE,
        error VARCHAR
    """,
    "step_rewards": """
        rollout_id VARCHAR NOT NULL,
        step_idx INTEGER NOT NULL,
        start_pos INTEGER,
        end_pos INTEGER,
        source VARCHAR NOT NULL,
        value DOUBLE
    """,
    "metrics": """
        run_id VARCHAR NOT NULL,
        train_step INTEGER,
        name VARCHAR NOT NULL,
        value DOUBLE
    """,
    "pair_builds": """
        build_id VARCHAR PRIMARY KEY,   -- one run of a pair rule (schema 5)
        rule VARCHAR NOT NULL,          -- best_vs_worst | correct_vs_incorrect | all_pairs
        level VARCHAR NOT NULL,         -- completion (groups) | step (fork siblings)
        params JSON,                    -- the rule's options
        scope JSON,                     -- the rollout filter / run ids it ran over
        rule_version_id VARCHAR,        -- whose rewards it compared
        created_at TIMESTAMP,
        n_pairs INTEGER                 -- pairs it added (pairs already stored are not added again)
    """,
    "pairs": """
        pair_id VARCHAR NOT NULL,       -- 'pr' + hash of kind, chosen and rejected rollout ids (schema 5); unique,
                                        -- kept so by the code that adds pairs (an index makes a million inserts slow)
        prompt_id VARCHAR NOT NULL,
        chosen_rollout_id VARCHAR NOT NULL,   -- as built; swapped = true exports them the other way round
        rejected_rollout_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL,          -- completion | step (fork siblings: same prefix, different continuation)
        prefix VARCHAR,                 -- step pairs: the completion text both share; exports append it to the prompt
        prefix_tokens INTEGER,          -- step pairs: the shared prefix in tokens
        rule VARCHAR,                   -- the pair rule, or 'hand'
        params JSON,                    -- the rule's options
        build_id VARCHAR,               -- pair_builds row (NULL for hand-picked pairs)
        rule_version_id VARCHAR,        -- the rewards compared
        chosen_reward DOUBLE,           -- total rewards under rule_version_id when the pair was made
        rejected_reward DOUBLE,         --   (a later difference marks the pair stale)
        margin DOUBLE,                  -- chosen_reward - rejected_reward
        status VARCHAR NOT NULL,        -- pending | accepted | rejected
        swapped BOOLEAN NOT NULL,       -- a reviewer reversed the preference
        note VARCHAR,
        reviewer VARCHAR,               -- who decided last
        decided_at TIMESTAMP,
        created_at TIMESTAMP,
        source VARCHAR NOT NULL         -- rule | hand
    """,
    "exports": """
        export_id VARCHAR PRIMARY KEY,  -- one written (or downloaded) data set (schema 5)
        created_at TIMESTAMP,
        path VARCHAR,                   -- where it was written; 'download:<file name>' for a download
        format VARCHAR,                 -- preference | unpaired | stepwise
        style VARCHAR,                  -- standard | conversational
        filetype VARCHAR,               -- jsonl | parquet | datasets
        n_rows INTEGER,
        n_pairs INTEGER,
        sha256 VARCHAR,                 -- of the file (a datasets folder: of its files in name order)
        provenance JSON                 -- the sidecar's summary (runs, policies, versions, rules, filters, decisions)
    """,
    "export_pairs": """
        export_id VARCHAR NOT NULL,     -- the pairs an export carried, with their decisions then (schema 5)
        pair_id VARCHAR NOT NULL,
        swapped BOOLEAN,                -- exported the other way round (pairs keeps the rollouts as built)
        reviewer VARCHAR,
        decided_at TIMESTAMP,
        note VARCHAR
    """,
    "token_shards": """
        shard_id VARCHAR PRIMARY KEY,   -- a Parquet file of token rows a bulk import wrote beside the store (schema 7)
        run_id VARCHAR NOT NULL,        -- the import run whose rollouts' tokens it holds
        file VARCHAR NOT NULL,          -- its name in the store's shard folder (<store file>.shards/)
        n_rows BIGINT,
        min_rollout_id VARCHAR,         -- the rollouts it covers (ids are made in order: one contiguous range)
        max_rollout_id VARCHAR,
        columns VARCHAR[],              -- the tokens columns the file has (the view reads the others as NULL)
        created_at TIMESTAMP
    """,
    "tokens_moved": """
        rollout_id VARCHAR PRIMARY KEY  -- a sharded rollout whose token rows were copied into token_rows to be
                                        --   changed (enrich fills them): its shard rows are no longer read (schema 7)
    """,
    "tasks": """
        name VARCHAR PRIMARY KEY,       -- a task the store defines, rebuilt from spec by every process (schema 8)
        kind VARCHAR NOT NULL,          -- dataset
        spec JSON NOT NULL,             -- studio.tasks.from_spec: answer, step and template settings, splits
        source VARCHAR,                 -- the file or folder its prompts were read from
        sha256 VARCHAR,                 -- of that source when it was read
        n_prompts INTEGER,
        created_at TIMESTAMP
    """,
    "import_files": """
        run_id VARCHAR NOT NULL,        -- the import run this source file fed (schema 6)
        path VARCHAR NOT NULL,          -- absolute path of the file
        format VARCHAR,                 -- trl | verl | openrlhf | generic
        size BIGINT,                    -- bytes when last read
        mtime DOUBLE,
        consumed BIGINT,                -- bytes imported so far (a tailed JSONL resumes here)
        n_rows INTEGER,                 -- rollouts added from it
        n_skipped INTEGER,              -- malformed lines skipped
        imported_at TIMESTAMP
    """,
}

# ``tokens`` is a view: its rows are stored in the table TOKEN_ROWS (every writer: Store.write maps
# "tokens" there) and in the Parquet shards of token_shards. Store.refresh_tokens_view writes the view.
VIEWS = frozenset({"tokens"})
TOKEN_ROWS = "token_rows"

# Tables that the sample Parquet files seed, in load order.
SEEDED = ("tasks", "runs", "prompts", "rule_versions", "rollouts", "tokens", "rewards", "turns", "turn_rewards",
          "metrics")  # metrics: a seeded mini-run's curves (sample_data/mismatch_runs)

# what a rollout written without its trajectory counts is: one assistant turn, no tool calls
SINGLE_TURN = "UPDATE rollouts SET n_turns = 1, n_tool_calls = 0, n_tool_errors = 0 WHERE n_turns IS NULL"

# version -> list of SQL statements that bring a store from version-1 to version.
MIGRATIONS: dict[int, list[str]] = {
    2: [],  # adds token_scores; new tables are created by ddl() after the migrations run
    3: [  # token_scores.value: per-token values of a critic (value model), for GAE
        f"CREATE TABLE IF NOT EXISTS token_scores ({TABLES['token_scores']})",
        "ALTER TABLE token_scores ADD COLUMN IF NOT EXISTS value FLOAT",
    ],
    4: [  # mini-runs: what each token and rollout was trained with, and why a run failed
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS error VARCHAR",
        "ALTER TABLE tokens ADD COLUMN IF NOT EXISTS train_weight FLOAT",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS train_advantage DOUBLE",
    ],
    5: [  # curated preference data: pairs, the rule runs that built them, exports. The old placeholder
        # `preferences` table (never written by the studio) is carried into `pairs`, then dropped.
        f"CREATE TABLE IF NOT EXISTS pairs ({TABLES['pairs']})",
        """CREATE TABLE IF NOT EXISTS preferences (pair_id VARCHAR PRIMARY KEY, prompt_id VARCHAR,
               chosen_rollout_id VARCHAR, rejected_rollout_id VARCHAR, origin VARCHAR, margin DOUBLE,
               status VARCHAR, note VARCHAR)""",
        """INSERT INTO pairs (pair_id, prompt_id, chosen_rollout_id, rejected_rollout_id, kind, rule,
                                        margin, status, swapped, note, source)
           SELECT pair_id, coalesce(prompt_id, ''), coalesce(chosen_rollout_id, ''), coalesce(rejected_rollout_id, ''),
                  'completion', coalesce(origin, 'hand'), margin, coalesce(status, 'pending'), false, note, 'hand'
           FROM preferences WHERE pair_id NOT IN (SELECT pair_id FROM pairs)""",
        "DROP TABLE preferences",
    ],
    6: [  # imports: which policy teacher-forced an imported rollout's tokens; import_files is created by ddl()
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS enriched_by VARCHAR",
    ],
    7: [  # bulk imports write token rows as Parquet shards: the table moves to token_rows, tokens becomes a view
        "ALTER TABLE tokens RENAME TO token_rows",
    ],
    8: [  # tasks a store defines, chat prompts, what a policy was given, and correctness as a fact of the rollout
        "ALTER TABLE prompts ADD COLUMN IF NOT EXISTS messages JSON",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS prompt_text VARCHAR",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS answer VARCHAR",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS correct BOOLEAN",
        # correctness of the rollouts made before it was stored, from what they were scored with: an import's own
        # correctness field (which the import stored as its version's `accuracy` component, value >= 1), ...
        """UPDATE rollouts SET correct = c.ok
           FROM (SELECT rw.rollout_id, bool_or(rw.value >= 1) AS ok FROM rewards rw
                 WHERE rw.rule_version_id LIKE 'import-%' AND rw.component = 'accuracy' GROUP BY rw.rollout_id) c
           WHERE rollouts.rollout_id = c.rollout_id AND rollouts.correct IS NULL""",
        # ... or the built-in rule of the rollout's task (its `accuracy` is the task's own check of the final
        # answer; the first such version), where the prompt has a gold answer. Store.open then runs the task's
        # verdict on the rollouts of built-in tasks still unchecked (store.fill_verdicts), which fills `answer`
        """UPDATE rollouts SET correct = b.ok
           FROM (SELECT ro.rollout_id, arg_min(rw.value >= 1, v.created_at) AS ok
                 FROM rollouts ro JOIN runs r ON r.run_id = ro.run_id JOIN prompts p ON p.prompt_id = ro.prompt_id
                 JOIN rewards rw ON rw.rollout_id = ro.rollout_id AND rw.component = 'accuracy'
                 JOIN rule_versions v ON v.rule_version_id = rw.rule_version_id
                      AND v.note = 'built-in rule' AND v.name = r.task
                 WHERE ro.correct IS NULL AND coalesce(p.gold->>'answer', '') <> ''
                 GROUP BY ro.rollout_id) b
           WHERE rollouts.rollout_id = b.rollout_id""",
    ],
    9: [  # agent trajectories: turns, the loss mask, per-turn rewards; a stored rollout is one assistant turn
        "ALTER TABLE token_rows ADD COLUMN IF NOT EXISTS turn_idx INTEGER",
        "ALTER TABLE token_rows ADD COLUMN IF NOT EXISTS trained BOOLEAN",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS n_turns INTEGER",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS n_tool_calls INTEGER",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS n_tool_errors INTEGER",
    ],
    10: [  # training-inference mismatch: a recomputed log-prob beside the behaviour one, and what produced each
        "ALTER TABLE token_rows ADD COLUMN IF NOT EXISTS train_logprob FLOAT",
        "ALTER TABLE token_rows ADD COLUMN IF NOT EXISTS train_rank INTEGER",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS engine VARCHAR",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS train_policy_version VARCHAR",
        "ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS train_engine VARCHAR",
        "ALTER TABLE token_scores ADD COLUMN IF NOT EXISTS engine VARCHAR",
        "ALTER TABLE token_scores ADD COLUMN IF NOT EXISTS rank INTEGER",
    ],
    11: [  # shared stores: which process runs each run
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS owner VARCHAR",
    ],
}


def physical(table: str) -> str:
    """The table that holds ``table``'s own rows (``tokens``: :data:`TOKEN_ROWS`)."""
    return TOKEN_ROWS if table == "tokens" else table


def ddl(shared: bool = False) -> list[str]:
    """Tables (and the ``tokens`` view over token_rows alone) that do not exist yet. ``shared``: for a
    DuckLake, which has no primary keys (a key column stays NOT NULL; inserts skip known keys)."""
    def body(cols: str) -> str:
        return cols.replace(" PRIMARY KEY", " NOT NULL") if shared else cols

    out = [f"CREATE TABLE IF NOT EXISTS {physical(name)} ({body(cols)})" for name, cols in TABLES.items()]
    return out + [f"CREATE VIEW IF NOT EXISTS tokens AS SELECT {', '.join(columns('tokens'))} FROM {TOKEN_ROWS}"]


def key_of(table: str) -> str | None:
    """The column that is ``table``'s primary key in a store file (None: the table has none)."""
    for line in TABLES.get(table, "").strip().splitlines():
        line = line.split("--")[0].strip()
        if " PRIMARY KEY" in line:
            return line.split()[0]
    return None


def columns(table: str) -> list[str]:
    """Column names of ``table`` in declaration order."""
    out = []
    for line in TABLES[table].strip().splitlines():
        line = line.split("--")[0].strip().rstrip(",")
        if line:
            out.append(line.split()[0])
    return out
