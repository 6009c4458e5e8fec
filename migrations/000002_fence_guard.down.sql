-- Fails if a user table still has a trigger using it: drop those triggers in
-- your own migrations first, so no protected table is silently unguarded.
DROP FUNCTION IF EXISTS pgfence_guard();
