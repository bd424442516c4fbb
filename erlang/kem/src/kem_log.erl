%%% @doc The port's log records, through OTP `logger'.
%%%
%%% The Python port writes each record at or above its level as a frame
%%% `{log, Level, Logger, Msg, Meta}' on its stdout (docs/protocol.md); its
%%% owner (`kem_port') hands the frame here. The record goes to `logger'
%%% with the port's metadata (`kem_port' name, `os_pid', `adapter',
%%% `kernel_id' when the record has one, `python_logger'), so a node
%%% filters, formats and routes it like any other.
%%%
%%% The `log' app env (`KEM_LOG' for the port) sets the level on both
%%% sides: the port sends nothing below it, and `setup/0' sets this
%%% module's logger level to it so the node does not drop what was asked
%%% for. An invalid level stops the application at start with
%%% `{bad_config, Detail}'.
%%%
%%% A port restart is expected (kill on timeout, crash): `kem_port' logs one
%%% warning, and the filter installed here drops the supervisor's
%%% `child_terminated' report for it.
-module(kem_log).
-include_lib("kernel/include/logger.hrl").

-export([setup/0, teardown/0, level/0, frame/2, drop_restart_reports/2]).

-define(LEVELS, [debug, info, warning, error, critical]).
-define(FILTER, kem_restart_reports).

%% @doc Check the `log' app env, apply it, install the restart filter.
-spec setup() -> ok | {error, {bad_config, binary()}}.
setup() ->
    case level() of
        {ok, Level} ->
            %% Only a level the operator set overrides the node's own.
            case application:get_env(kem, log, undefined) of
                undefined -> ok;
                _ -> ok = logger:set_module_level(?MODULE, Level)
            end,
            _ = logger:add_primary_filter(?FILTER, {fun ?MODULE:drop_restart_reports/2, kem_sup}),
            ok;
        {error, _} = Error ->
            Error
    end.

-spec teardown() -> ok.
teardown() ->
    _ = logger:remove_primary_filter(?FILTER),
    _ = logger:unset_module_level(?MODULE),
    ok.

%% @doc The configured level (default `warning'), or why it is invalid.
-spec level() -> {ok, logger:level()} | {error, {bad_config, binary()}}.
level() ->
    Raw = application:get_env(kem, log, undefined),
    case normalise(Raw) of
        undefined -> {ok, warning};
        Level ->
            case lists:member(Level, ?LEVELS) of
                true -> {ok, Level};
                false ->
                    {error, {bad_config, iolist_to_binary(
                        io_lib:format("log: ~0p is not a log level (debug, info, warning, error, critical)", [Raw]))}}
            end
    end.

normalise(undefined) -> undefined;
normalise(A) when is_atom(A) -> normalise(atom_to_list(A));
normalise(B) when is_binary(B) -> normalise(binary_to_list(B));
normalise(L) when is_list(L) ->
    try list_to_existing_atom(string:lowercase(L)) catch error:badarg -> not_a_level end;
normalise(_) -> not_a_level.

%% @doc Log one frame of port Name; false if Frame is not a log frame.
-spec frame(atom(), term()) -> boolean().
frame(Name, {log, Level, Logger, Msg, Meta}) when is_atom(Level), is_map(Meta) ->
    Level1 = case lists:member(Level, ?LEVELS) of true -> Level; false -> warning end,
    Text = text(Msg),
    %% No `domain': OTP's default handler prints only records without one
    %% (or under [otp, sasl]), and these are for the operator to see.
    Full = maps:merge(port_meta(Meta), #{kem_port => Name, python_logger => text(Logger)}),
    ?LOG(Level1, "~ts: ~ts", [Name, Text], Full),
    true;
frame(_Name, _Other) ->
    false.

port_meta(Meta) ->
    maps:from_list([{K, meta_value(V)} || {K, V} <- maps:to_list(Meta), is_atom(K)]).

meta_value(V) when is_binary(V) -> V;
meta_value(V) when is_integer(V); is_atom(V) -> V;
meta_value(V) -> iolist_to_binary(io_lib:format("~0p", [V])).

text(B) when is_binary(B) -> B;
text(Other) -> iolist_to_binary(io_lib:format("~0p", [Other])).

%% @doc A primary logger filter: drop the supervisor's report of a kem port
%% that stopped with `{shutdown, _}' (kem_port already logged one warning).
-spec drop_restart_reports(logger:log_event(), atom()) -> logger:filter_return().
drop_restart_reports(#{msg := {report, #{label := {supervisor, child_terminated}, report := Report}}} = Event, Sup) ->
    case {proplists:get_value(supervisor, Report), proplists:get_value(reason, Report)} of
        {{local, Sup}, {shutdown, _}} -> stop;
        _ -> Event
    end;
drop_restart_reports(Event, _Sup) ->
    Event.
