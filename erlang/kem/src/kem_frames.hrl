%% Shared by the port owner (kem_port) and its frame builder (kem_group):
%% a call frame over this many bytes is sent alone, never held or put in
%% a calls or group frame (docs/protocol.md, "Batch frames"). One define,
%% so the owner's send-at-once rule and kem_group's partition cannot drift.
-define(LONE_BYTES, 65536).
