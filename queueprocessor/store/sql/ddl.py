"""PostgreSQL DDL the farm writes as text (functions, triggers, side tables): in the schema its tables were made in,
named with that schema, since each function pins its search_path; and run as written."""

from typing import Any

from sqlalchemy import DDL, text


def farm_schema(conn: Any) -> str:
    """The schema the farm's tables were made in: the first of the session's search_path, as create_all made them."""
    name: str = conn.execute(text("SELECT current_schema()")).scalar_one()
    return name


def quoted(schema: str) -> str:
    """`schema` (the database's own name of it) as an identifier for DDL text."""
    return '"' + schema.replace('"', '""') + '"'


def run(conn: Any, statement: str) -> None:
    """Run DDL text as written: SQLAlchemy's DDL formats its text with %, so its own percent signs are doubled."""
    conn.execute(DDL(statement.replace("%", "%%")))


def side_triggers(name: str, column: str, function: str) -> str:
    """The three triggers by which `function` keeps side table `name` of qp_jobs' `column`: after the insert of a
    row that has one, an update that changes it, the delete of a row that had one; each fires only for those rows."""
    return f"""
CREATE TRIGGER {name}_added AFTER INSERT ON qp_jobs
FOR EACH ROW WHEN (NEW.{column} IS NOT NULL) EXECUTE FUNCTION {function}();
CREATE TRIGGER {name}_changed AFTER UPDATE OF {column} ON qp_jobs
FOR EACH ROW WHEN (OLD.{column} IS DISTINCT FROM NEW.{column}) EXECUTE FUNCTION {function}();
CREATE TRIGGER {name}_gone AFTER DELETE ON qp_jobs
FOR EACH ROW WHEN (OLD.{column} IS NOT NULL) EXECUTE FUNCTION {function}();
"""
