%%% @doc Is each port able to run kernels, on what, and if not, why?
%%%
%%% `kem:ping/0' only says a port process answers. `report/0' asks every
%%% port's `health' method (docs/protocol.md): whether its adapter is
%%% usable, which one, `cpu' or `gpu', and the reason when it has none or
%%% fell back to a CPU adapter. A port that does not answer is reported as
%%% unusable with the reason from `kem_port:call/4'.
-module(kem_health).

-export([report/0, summary/0]).

-define(TIMEOUT, 5000).

-type port_health() :: #{usable := boolean(), adapter := binary() | undefined,
                         kind := binary(), backend := binary() | undefined,
                         reason := binary() | undefined, os_pid => integer()}.
-export_type([port_health/0]).

%% @doc One entry per port, by registered name.
-spec report() -> {ok, #{atom() => port_health()}} | {error, kem_port:reason()}.
report() ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined -> {error, {not_started, <<"application kem is not running">>}};
        {Names, _} -> {ok, maps:from_list([{Name, port(Name)} || Name <- tuple_to_list(Names)])}
    end.

%% @doc The report as a JSON-ready map for `dev_kem''s `info': binary keys,
%% `null' for missing values, and whether every port is usable. No OS pid:
%% any HTTP client reads `info', and a pid that changes tells a stranger
%% when other callers' work restarted a port (issue 24's third red team).
-spec summary() -> map().
summary() ->
    case report() of
        {ok, Ports} ->
            #{<<"usable">> => lists:all(fun(#{usable := U}) -> U end, maps:values(Ports)),
              <<"ports">> => maps:from_list([{atom_to_binary(N), json_ready(maps:remove(os_pid, H))}
                                                || {N, H} <- maps:to_list(Ports)])};
        {error, {Reason, Detail}} ->
            #{<<"usable">> => false, <<"reason">> => <<(atom_to_binary(Reason))/binary, ": ", Detail/binary>>}
    end.

port(Name) ->
    case kem_port:call(Name, health, {}, ?TIMEOUT) of
        {ok, Health} when is_map(Health) ->
            Health#{os_pid => catch_os_pid(Name)};
        {error, {Reason, Detail}} ->
            #{usable => false, adapter => undefined, kind => <<"none">>, backend => undefined,
              reason => iolist_to_binary([atom_to_binary(Reason), ": ", detail(Detail)])}
    end.

catch_os_pid(Name) ->
    try kem_port:os_pid(Name) catch exit:_ -> undefined end.

detail(B) when is_binary(B) -> B;
detail(Other) -> io_lib:format("~0p", [Other]).

json_ready(Map) ->
    maps:from_list([{atom_to_binary(K), null_for_undefined(V)} || {K, V} <- maps:to_list(Map)]).

null_for_undefined(undefined) -> null;
null_for_undefined(V) -> V.
