"""Everything the gateway keeps in PostgreSQL: schema, pool, migrations, and the SQL of each store."""
