/*
 * topk_refuse: the SQL functions' refusals as plain errors, without CONTEXT lines.
 *
 * topk._refuse(state, message, hint) is called by every plpgsql front of schema topk
 * (frontends/sql_function.py) on an error of its PL/Python body. A refusal of the project
 * (message "plpy.Error: topk: ...") is raised again with its SQLSTATE, its message without
 * PL/Python's exception name, and its hint. The error context callbacks of the calling
 * functions are dropped first: PL/pgSQL would otherwise add a CONTEXT line for every frame
 * ("PL/pgSQL function ... line N at RAISE"), and a refusal tells the analyst its message only.
 * Anything else returns, and the front re-raises it as it came.
 *
 * Dropping the callbacks is safe: the error unwinds to a PG_TRY, which restores the stack it
 * saved, or to the top level, which resets it.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(topk_refuse);

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
