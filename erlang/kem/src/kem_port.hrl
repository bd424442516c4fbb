%% Shared by the port owner (kem_port) and its callers' side (kem_port_call).

-define(MARGIN_MS, 2000).
%% What a timer and a receive accept (2^32 - 1 ms), margin included: a
%% caller's timeout outside this is refused, never able to crash the owner.
-define(IS_TIMEOUT(T), (T =:= infinity orelse
                        (is_integer(T) andalso T >= 1 andalso T =< 16#FFFFFFFF - ?MARGIN_MS))).
%% Answered to a call still in the mailbox of an owner that stops: it never
%% reached the port, so it is safe to send again to the replacement.
-define(RETRY, '$kem_port_retry').
