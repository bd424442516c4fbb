%%% @doc The reply messages of `dev_kem' (and its `execute_chain'): what
%%% HyperBEAM sends back to an HTTP client.
%%%
%%% HyperBEAM's httpsig codec turns every top-level binary of a reply into an
%%% HTTP header, written as is (hb_http:reply/5; cowboy checks no value). A
%%% failure's detail may quote a stranger's kernel (naga's errors print the
%%% failing source line, box characters and newlines included), so a detail
%%% at the top level would let a kernel write its own headers (`Set-Cookie')
%%% or break the reply's framing (issue 24). So the top level carries only
%%% what kem chose itself, as one short line of printable ASCII: the status,
%%% a fixed message, the reason's name, `retry-after', the usage numbers; the
%%% detail goes only into the JSON body, escaped by the JSON encoder.
%%% `header_safe/1' drops anything else at the last step, whatever a caller
%%% put there.
-module(kem_reply).

-export([success/3, failure/2, error/4, json/2, status/1, header_safe/1]).

%% A header line is far shorter in practice (a reason's name, a kernel id
%% of at most 128 characters); anything longer is not kem's own.
-define(MAX_HEADER, 256).

%% @doc A 200 with the result bytes; the usage metered and as top-level keys.
-spec success(binary(), kem:usage(), map()) -> {ok, map()}.
success(Result, Usage, Opts) ->
    kem_metering:report(Usage, Opts),
    {ok, header_safe(maps:merge(usage_keys(Usage),
                                #{<<"status">> => 200, <<"body">> => Result,
                                  <<"content-type">> => <<"application/octet-stream">>}))}.

%% @doc A failure `{Reason, Detail}' as a 4xx/5xx by its reason.
-spec failure(binary(), term()) -> {error, map()}.
failure(Message, {Reason, Detail}) when is_atom(Reason) ->
    retry_after(Reason, error(status(Reason), Message, Reason, Detail));
failure(Message, Other) ->
    error(500, Message, internal, Other).

%% @doc The reply of a failure: `status', `error' (Message, kem's own),
%% `reason' at the top level; the same and `details' as the JSON body.
-spec error(400..599, binary(), atom(), term()) -> {error, map()}.
error(Status, Message, Reason, Detail) ->
    Fields = #{<<"error">> => Message,
               <<"reason">> => atom_to_binary(Reason, utf8),
               <<"details">> => kem_redact:text(Detail)},
    {error, header_safe(#{<<"status">> => Status,
                          <<"error">> => Message,
                          <<"reason">> => reason_name(Reason),
                          <<"content-type">> => <<"application/json">>,
                          <<"body">> => kem_json:encode(Fields)})}.

%% @doc A JSON reply of Map with Status.
-spec json(100..599, map()) -> {ok, map()}.
json(Status, Map) ->
    {ok, #{<<"status">> => Status,
           <<"content-type">> => <<"application/json">>,
           <<"body">> => kem_json:encode(Map)}}.

%% @doc Reply with only the keys that are safe as HTTP headers: `body',
%% integers, and binaries of at most 256 bytes of printable ASCII (0x20 to
%% 0x7E: no CR, LF, NUL or other control, no byte a header parser reads
%% another way). Keys must be lowercase tokens too.
-spec header_safe(map()) -> map().
header_safe(Reply) ->
    maps:filter(fun(<<"body">>, _) -> true;
                   (Key, Value) -> token(Key) andalso (is_integer(Value) orelse line(Value))
                end, Reply).

%% @doc Who must act: the requester (4xx) or the node (5xx). An unknown
%% kernel is a 400, not a 404: HyperBEAM replaces every 404 reply sent with
%% its default codec by its own HTML page, and the reason would be lost.
-spec status(atom()) -> 400..599.
status(bad_request) -> 400;
status(bad_args) -> 400;
status(invalid_kernel_id) -> 400;
status(kernel_not_found) -> 400;
status(not_found) -> 400;
status(too_large) -> 413;
status(not_pinned) -> 403;
status(owner_not_allowed) -> 403;
status(shader_error) -> 422;
status(bad_kernel) -> 422;
status(dispatch_too_large) -> 422;
status(kernel_rejected) -> 422;
%% The caller's budget did not cover the work (docs/metering.md): the kernel
%% and the request are fine, a larger gas_limit (paying more) succeeds.
status(gas_exhausted) -> 402;
status(no_buffer) -> 400;
status(quota_exceeded) -> 413;
status(overloaded) -> 503;
status(quarantined) -> 503;
status(port_unavailable) -> 503;
%% The node's port died or was replaced under the call: the node's fault,
%% and passing (503), not a bug (500).
status(port_exited) -> 503;
status(port_restarted) -> 503;
status(session_lost) -> 503;
status(not_started) -> 503;
status(no_kem_node) -> 503;
status(no_local_gpu) -> 503;
status(timeout) -> 504;
status(Reason) ->
    %% Every gateway failed to prove the kernel: the fault is upstream.
    case lists:member(Reason, [id_mismatch, bad_signature, data_root_mismatch, size_mismatch,
                               header_unavailable, bad_header, pin_mismatch,
                               unsupported_signature_type, fetch_failed, unreachable,
                               http_error, bad_response]) of
        true -> 502;
        false -> 500
    end.

%%% internals

%% A port being replaced (a warm spare takes over within ms, docs/
%% reliability.md): the same request may be sent again, so say when. HTTP's
%% unit is 1 s. Not for `session_lost': that session is gone, a retry needs
%% a new one.
retry_after(Reason, {error, Fields}) when Reason =:= port_exited; Reason =:= port_restarted;
                                         Reason =:= port_unavailable ->
    {error, Fields#{<<"retry-after">> => <<"1">>}};
retry_after(_Reason, Reply) ->
    Reply.

usage_keys(Usage = #{kernel_id := K, bytes_in := In, bytes_out := Out, us := Us, clock := Clock}) ->
    gas_key(Usage, #{<<"kem-usage-kernel-id">> => kernel_ids(K),
      <<"kem-usage-node">> => atom_to_binary(maps:get(node, Usage, node()), utf8),
      <<"kem-usage-bytes-in">> => In,
      <<"kem-usage-bytes-out">> => Out,
      <<"kem-usage-us">> => Us,
      <<"kem-usage-clock">> => atom_to_binary(Clock, utf8)}).

%% `kem-usage-gas' where the record has gas (docs/metering.md): every kernel
%% call's and a named run's (dev_kem_run); a chain's where its road says it.
gas_key(#{gas := Gas}, Keys) when is_integer(Gas) -> Keys#{<<"kem-usage-gas">> => Gas};
gas_key(_Usage, Keys) -> Keys.

%% A chain's ids, comma-joined, can run to 256 x 128 bytes: cut at the last
%% whole id that fits, with `,...' saying so (metering has the full list).
kernel_ids(K) when is_binary(K), byte_size(K) > ?MAX_HEADER ->
    Cut = binary:part(K, 0, ?MAX_HEADER - 4),
    case binary:matches(Cut, <<",">>) of
        [] -> <<"...">>;
        Commas -> {Last, _} = lists:last(Commas), <<(binary:part(Cut, 0, Last))/binary, ",...">>
    end;
kernel_ids(K) when is_binary(K) -> K;
kernel_ids(_) -> <<"none">>.

%% A reason is one of kem's or the port's atoms; shown only when it is a
%% plain name.
reason_name(Reason) ->
    Name = atom_to_binary(Reason, utf8),
    case re:run(Name, <<"^[a-z][a-z0-9_]{0,63}$">>, [{capture, none}, dollar_endonly]) of
        match -> Name;
        nomatch -> <<"internal">>
    end.

token(Key) when is_binary(Key), byte_size(Key) > 0, byte_size(Key) =< 64 ->
    re:run(Key, <<"^[a-z0-9-]+$">>, [{capture, none}, dollar_endonly]) =:= match;  % no key ending in LF
token(_) -> false.

line(Value) when is_binary(Value), byte_size(Value) =< ?MAX_HEADER ->
    lists:all(fun(C) -> C >= 16#20 andalso C =< 16#7E end, binary_to_list(Value));
line(_) -> false.

%%% tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

%% Every reason the port or kem can give maps to the side that must act.
status_by_reason_test() ->
    Client = [bad_args, invalid_kernel_id, kernel_not_found, too_large, shader_error,
              bad_kernel, kernel_rejected, no_buffer, quota_exceeded, not_pinned],
    [?assert(status(R) >= 400 andalso status(R) < 500) || R <- Client],
    ?assertEqual(422, status(kernel_rejected)),
    ?assertEqual(503, status(quarantined)),
    ?assertEqual(502, status(bad_response)),
    ?assertEqual(500, status(internal)).

%% A restarting port is a 503 with Retry-After; a lost session is not.
restart_replies_test() ->
    [begin
         {error, Reply} = failure(<<"kem call failed">>, {Reason, <<"the port is restarting">>}),
         ?assertMatch(#{<<"status">> := 503, <<"retry-after">> := <<"1">>,
                        <<"content-type">> := <<"application/json">>}, Reply),
         ?assertMatch({ok, #{<<"reason">> := _}}, kem_json:decode(maps:get(<<"body">>, Reply)))
     end || Reason <- [port_exited, port_restarted, port_unavailable]],
    {error, Lost} = failure(<<"kem call failed">>, {session_lost, <<"gone">>}),
    ?assertNot(maps:is_key(<<"retry-after">>, Lost)),
    {error, Internal} = failure(<<"kem call failed">>, {internal, <<"x">>}),
    ?assertMatch(#{<<"status">> := 500}, Internal).

%% Whatever a detail holds stays in the body; odd reasons show as internal.
header_safe_test() ->
    Hostile = <<"a\r\nSet-Cookie: x=1\n", 16#E2, 16#80, 16#A8, 0, 16#FF>>,
    {error, Reply} = failure(<<"m">>, {'Bad\nReason', Hostile}),
    ?assertEqual(lists:sort([<<"status">>, <<"error">>, <<"reason">>, <<"content-type">>, <<"body">>]),
                 lists:sort(maps:keys(Reply))),
    ?assertMatch(#{<<"reason">> := <<"internal">>, <<"status">> := 500}, Reply),
    {ok, #{<<"details">> := Details}} = kem_json:decode(maps:get(<<"body">>, Reply)),
    ?assertMatch(<<"a\r\nSet-Cookie: x=1\n", _/binary>>, Details),
    ?assertEqual(#{<<"body">> => <<1>>, <<"ok">> => <<"fine">>, <<"n">> => 3},
                 header_safe(#{<<"body">> => <<1>>, <<"ok">> => <<"fine">>, <<"n">> => 3,
                               <<"bad">> => <<"x\ny">>, <<"Set-Cookie">> => <<"a">>,
                               <<"long">> => binary:copy(<<"a">>, 257), <<"map">> => #{}})),
    Ids = iolist_to_binary(lists:join(<<",">>, lists:duplicate(40, binary:copy(<<"k">>, 43)))),
    Cut = kernel_ids(Ids),
    ?assert(byte_size(Cut) =< 256),
    ?assertMatch(<<"kkk", _/binary>>, Cut),
    ?assertEqual(<<",...">>, binary:part(Cut, byte_size(Cut) - 4, 4)).
-endif.
