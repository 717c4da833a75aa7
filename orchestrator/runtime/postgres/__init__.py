"""The PostgreSQL repository: a home's rows in a database several homes share, with a lease and a fence.

Imported only when ``[repository] url`` names a PostgreSQL database (asyncpg is
the optional extra ``postgresql``); see :mod:`.repository`, :mod:`.lease` and
:mod:`.schema`.
"""
