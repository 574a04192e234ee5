/*
 * topk_server: the C helpers of the SQL functions of schema topk (frontends/sql_function.py).
 *
 * topk._refuse(state, message, hint): refusals as plain errors, without CONTEXT lines.
 *   Every plpgsql front calls it on an error of its PL/Python body. A refusal of the project
 *   (message "plpy.Error: topk: ...") is raised again with its SQLSTATE, its message without
 *   PL/Python's exception name, and its hint. The error context callbacks of the calling
 *   functions are dropped first: PL/pgSQL would otherwise add a CONTEXT line for every frame
 *   ("PL/pgSQL function ... line N at RAISE"), and a refusal tells the analyst its message
 *   only. Anything else returns, and the front re-raises it as it came. Dropping the callbacks
 *   is safe: the error unwinds to a PG_TRY, which restores the stack it saved, or to the top
 *   level, which resets it.
 *
 * topk._hide_io_begin() and topk._hide_io_end(): the call's reads kept out of the caller's
 *   instrumentation. PostgreSQL counts the buffers and the WAL a backend uses in two global
 *   counters (pgBufferUsage, pgWalUsage); EXPLAIN (ANALYZE, BUFFERS, WAL) of a statement, and
 *   pg_stat_statements, report the difference of those counters across each plan node, so a
 *   call's node would show every page the function's SPI queries touched. Every front calls
 *   _hide_io_begin() before its body and _hide_io_end() after it (and on its error path): the
 *   second sets both counters back to what the first saw, so the function's reads add nothing
 *   to any node around the call. Calls may nest; the outermost pair saves and restores. Each
 *   level remembers the subtransaction it began in: when that subtransaction (or one around
 *   it) aborts, by an error, a cancel or statement_timeout, whether or not the caller catches
 *   it, the levels it held are dropped and, once none is left, the counters are set back as
 *   _hide_io_end() would have done. So a call cut off inside the window neither shows the
 *   reads it made before the cut nor leaves a level behind that would keep later calls of the
 *   same statement from restoring. The saved state also belongs to one top-level statement
 *   (its start time and local transaction id) and is dropped when a transaction aborts.
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/instrument.h"
#include "fmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(topk_refuse);
PG_FUNCTION_INFO_V1(topk_hide_io_begin);
PG_FUNCTION_INFO_V1(topk_hide_io_end);

void		_PG_init(void);

#define REFUSAL_PREFIX "plpy.Error: topk: "
#define PYTHON_NAME_LENGTH 12 /* "plpy.Error: " */

static bool
is_sqlstate(const char *state)
{
	if (strlen(state) != 5)
		return false;
	for (int i = 0; i < 5; i++)
		if (!((state[i] >= '0' && state[i] <= '9') || (state[i] >= 'A' && state[i] <= 'Z')))
			return false;
	return true;
}

Datum
topk_refuse(PG_FUNCTION_ARGS)
{
	char	   *state;
	char	   *message;
	char	   *hint = NULL;
	int			code = ERRCODE_INTERNAL_ERROR;

	if (PG_ARGISNULL(1))
		PG_RETURN_VOID();
	message = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (strncmp(message, REFUSAL_PREFIX, strlen(REFUSAL_PREFIX)) != 0)
		PG_RETURN_VOID();
	if (!PG_ARGISNULL(0))
	{
		state = text_to_cstring(PG_GETARG_TEXT_PP(0));
		if (is_sqlstate(state))
			code = MAKE_SQLSTATE(state[0], state[1], state[2], state[3], state[4]);
	}
	if (!PG_ARGISNULL(2))
	{
		hint = text_to_cstring(PG_GETARG_TEXT_PP(2));
		if (hint[0] == '\0')
			hint = NULL;
	}
	error_context_stack = NULL;
	ereport(ERROR,
			(errcode(code),
			 errmsg_internal("%s", message + PYTHON_NAME_LENGTH),
			 hint ? errhint("%s", hint) : 0));
	PG_RETURN_VOID();
}

/* The counters as the outermost _hide_io_begin() of the current statement saw them. */
#define MAX_HIDE_DEPTH 64
static int	hide_depth = 0;
static SubTransactionId hide_subtransaction[MAX_HIDE_DEPTH];	/* where each level began */
static TimestampTz hide_statement = 0;
static LocalTransactionId hide_transaction = InvalidLocalTransactionId;
static BufferUsage hidden_buffers;
static WalUsage hidden_wal;

static bool
same_statement(void)
{
	return hide_statement == GetCurrentStatementStartTimestamp() &&
		hide_transaction == MyProc->lxid;
}

static void
restore_counters(void)
{
	pgBufferUsage = hidden_buffers;
	pgWalUsage = hidden_wal;
}

static void
forget_on_abort(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		hide_depth = 0;
}

/*
 * A subtransaction aborts: the levels begun in it or in one it encloses (subtransaction ids
 * grow within a transaction, and every open one that began before the level is an ancestor)
 * end with it; when the last goes, the counters are set back.
 */
static void
close_on_subabort(SubXactEvent event, SubTransactionId mySubid,
				  SubTransactionId parentSubid, void *arg)
{
	if (event != SUBXACT_EVENT_ABORT_SUB || hide_depth == 0)
		return;
	if (!same_statement())
	{
		hide_depth = 0;
		return;
	}
	while (hide_depth > 0 && hide_subtransaction[hide_depth - 1] >= mySubid)
		hide_depth--;
	if (hide_depth == 0)
		restore_counters();
}

void
_PG_init(void)
{
	RegisterXactCallback(forget_on_abort, NULL);
	RegisterSubXactCallback(close_on_subabort, NULL);
}

Datum
topk_hide_io_begin(PG_FUNCTION_ARGS)
{
	if (hide_depth > 0 && !same_statement())
		hide_depth = 0;			/* left by a call of an earlier statement */
	if (hide_depth >= MAX_HIDE_DEPTH)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg_internal("topk: calls of the topk functions nested more than %d deep",
								 MAX_HIDE_DEPTH)));
	if (hide_depth == 0)
	{
		hidden_buffers = pgBufferUsage;
		hidden_wal = pgWalUsage;
		hide_statement = GetCurrentStatementStartTimestamp();
		hide_transaction = MyProc->lxid;
	}
	hide_subtransaction[hide_depth++] = GetCurrentSubTransactionId();
	PG_RETURN_VOID();
}

Datum
topk_hide_io_end(PG_FUNCTION_ARGS)
{
	if (hide_depth == 0 || !same_statement())
	{
		hide_depth = 0;
		PG_RETURN_VOID();
	}
	if (--hide_depth == 0)
		restore_counters();
	PG_RETURN_VOID();
}
