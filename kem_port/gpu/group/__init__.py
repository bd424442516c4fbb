"""Many calls in one dispatch: a group frame's job (``group_job``,
``group_stage``), a plain kernel's slot form (``slot_kernel``,
``slot_uses``, ``slot_dispatch``) and the call table (``call_table``,
``group_table``). Plans the executor runs on its batch road; each binds
only its own calls' bytes (docs/security.md section 8).
"""
